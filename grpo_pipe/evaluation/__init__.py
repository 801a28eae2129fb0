"""Held-out evaluation: scoring completions as the run's reward does (`held_out`), and when to evaluate, which model is
the best so far, when to stop early (`schedule`)."""
