"""Checkpoints of the whole training state (the `checkpoint` group): the store, resuming, the manifest of each folder."""
