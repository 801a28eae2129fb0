"""Tools shipped with grpo_pipe: `calculator` (exact arithmetic) and `python` (a sandboxed interpreter)."""
