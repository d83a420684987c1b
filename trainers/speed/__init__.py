"""What makes a training step fast without changing its result: torch.compile applied to the
strategy's model (`compile`)."""
