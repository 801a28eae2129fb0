"""Failures a rollout engine reports in its own words, so the runner can react without knowing the engine."""


class EngineLost(RuntimeError):
    """The engine's process or actor died; its in-flight requests are gone. A restart can recover."""


class EngineGaveUp(RuntimeError):
    """Engines died more often than the placement allows restarting them."""


class GenerationAbandoned(RuntimeError):
    """The engine shut down while a generation ran on its background thread; that batch was never needed."""
