"""The runner: the job (`pipeline`), the algorithm over the components (`recipe`), the components built from the
config (`components`), the run's own settings (`settings`, the `run` group) and the bookkeeping of each step."""
