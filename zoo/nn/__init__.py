"""zoo.nn: the fused layers every zoo model is built from, each saving as few tensors as its
backward needs. PyTorch paths run everywhere; Triton kernels join them on GPUs."""

from zoo.nn.cross_entropy import linear_cross_entropy

__all__ = ["linear_cross_entropy"]
