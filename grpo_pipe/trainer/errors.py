"""Failures a trainer reports in its own words, so the runner can react without knowing the trainer."""


class TrainerLost(RuntimeError):
    """A trainer rank died (its process, or the node it ran on): its shard of the weights and optimizer state is
    gone with it, so the run cannot go on; its last checkpoint has everything up to that checkpoint's step."""
