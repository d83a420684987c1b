"""How a model spreads over ranks: the device mesh, tensor and sequence parallelism from a model's
plan (with its collectives and the vocabulary-parallel loss), axial parallelism, and the scalar
parameters FSDP2 cannot shard."""
