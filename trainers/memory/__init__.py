"""What memory a step holds and how to hold less: measurement (live tensors by category, peaks),
recompute, the chunk sizes of chunked operations, per-block activation plans (`activations/`) and
model states in chunks moving between device, host memory and disk (`chunks/`)."""
