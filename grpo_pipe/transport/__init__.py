"""Moving weights between processes: flat buckets of tensors and private collective groups, shared by the
weight bridges (the engine's side and the trainer's) and by the sharded trainer's rank 0, which sends itself."""
