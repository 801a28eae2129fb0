"""Hydra configs shipped with the package (`pkg://grpo_pipe.conf`): the installed command composes them from any directory."""
