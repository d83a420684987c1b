"""What each block does with the activations it saves for backward: keep, swap to files, recompute."""
