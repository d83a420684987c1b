"""Rigid frames: a rotation and a translation per residue, mapping local to global coordinates.

    global = rotation @ local + translation;  rotation (..., 3, 3), translation (..., 3), in Å

Built from backbone atoms (AlphaFold's Gram-Schmidt on N, CA, C: the origin at CA, x towards C,
N in the xy-plane), composed with the structure module's quaternion updates, and placing the
backbone atoms of an ideal residue.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IDEAL_BACKBONE = torch.tensor([[-0.525, 1.363, 0.0], [0.0, 0.0, 0.0], [1.526, 0.0, 0.0]])
"""(3, 3) local coordinates (Å) of N, CA, C in their residue's frame (Engh & Huber geometry, as in
AlphaFold's rigid-group table: N-CA 1.458 Å, CA-C 1.526 Å, N-CA-C 111°)."""


@dataclass
class Frames:
    """A batch of rigid transforms: rotation (..., 3, 3), translation (..., 3)."""

    rotation: torch.Tensor
    translation: torch.Tensor

    @classmethod
    def identity(cls, shape: tuple[int, ...], device: torch.device | None = None, dtype: torch.dtype = torch.float32
                 ) -> Frames:
        """Identity frames of batch shape `shape`."""
        rotation = torch.eye(3, device=device, dtype=dtype).expand(*shape, 3, 3).clone()
        return cls(rotation, torch.zeros(*shape, 3, device=device, dtype=dtype))

    @classmethod
    def from_points(cls, nitrogen: torch.Tensor, alpha: torch.Tensor, carbon: torch.Tensor, eps: float = 1e-8
                    ) -> Frames:
        """Frames of residues from their N, CA, C positions (..., 3): origin CA, x along CA->C,
        y in the plane of N, CA, C on N's side, z = x × y."""
        x = carbon - alpha
        x = x / (x.norm(dim=-1, keepdim=True) + eps)
        to_n = nitrogen - alpha
        y = to_n - (to_n * x).sum(-1, keepdim=True) * x
        y = y / (y.norm(dim=-1, keepdim=True) + eps)
        return cls(torch.stack([x, y, torch.cross(x, y, dim=-1)], dim=-1), alpha)

    def __getitem__(self, index) -> Frames:
        """Frames indexed over the batch dimensions (None adds a broadcast dimension)."""
        return Frames(self.rotation[index], self.translation[index])

    def apply(self, points: torch.Tensor) -> torch.Tensor:
        """Local points (..., 3) -> global (broadcast against the frames' batch shape)."""
        return (self.rotation @ points[..., None])[..., 0] + self.translation

    def invert_apply(self, points: torch.Tensor) -> torch.Tensor:
        """Global points (..., 3) -> local coordinates of these frames."""
        return (self.rotation.transpose(-1, -2) @ (points - self.translation)[..., None])[..., 0]

    def compose(self, other: Frames) -> Frames:
        """self ∘ other: apply other, then self."""
        return Frames(self.rotation @ other.rotation, self.apply(other.translation))

    def detach_rotation(self) -> Frames:
        """The same frames with the rotation cut from the graph (AlphaFold stops rotation gradients
        between structure-module layers for stability)."""
        return Frames(self.rotation.detach(), self.translation)

    def backbone(self) -> torch.Tensor:
        """(..., 3, 3) global N, CA, C of ideal residues placed in these frames."""
        local = IDEAL_BACKBONE.to(self.translation)
        return (self.rotation[..., None, :, :] @ local[..., None])[..., 0] + self.translation[..., None, :]


def quaternion_update(update: torch.Tensor) -> Frames:
    """(..., 6) -> frames: the vector part (b, c, d) of a non-unit quaternion (1, b, c, d),
    normalised, as a rotation, and a translation (AlphaFold's backbone update, Algorithm 23)."""
    b, c, d = update[..., 0], update[..., 1], update[..., 2]
    norm = torch.sqrt(1 + b * b + c * c + d * d)
    a, b, c, d = 1 / norm, b / norm, c / norm, d / norm
    rotation = torch.stack([
        a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c),
        2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b),
        2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d,
    ], dim=-1).unflatten(-1, (3, 3))
    return Frames(rotation, update[..., 3:])
