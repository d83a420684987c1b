"""Triton kernels behind the `zoo.nn` ops (imported only when the Triton backend runs)."""
