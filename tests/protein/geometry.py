"""Random rotations and Cα-like chains for the protein tests (float64)."""

import torch


def random_rotation(seed: int) -> torch.Tensor:
    """(3, 3) proper rotation drawn from a seeded QR decomposition."""
    q, r = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.det(q) > 0 else -q


def random_walk(length: int, seed: int) -> torch.Tensor:
    """(length, 3) Cα-like chain: 3.8 Å steps in random directions."""
    steps = torch.randn(length, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return (3.8 * steps / steps.norm(dim=-1, keepdim=True)).cumsum(0)
