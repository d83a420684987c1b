"""Model inputs from a sequence and, when there is one, its sequence profile.

The profile (L, 20) of per-position amino-acid frequencies stands in for an MSA: row 0 of the MSA
input is the query sequence, rows 1..S-1 are sequences sampled column by column from the profile,
so the MSA code paths (row and column attention, outer product mean) see a real alignment-like
input. Each row's features: one-hot residue (21), the profile (21, X = 0) and a has-profile flag.
A sequence without a profile (a new sequence, or one whose profile training withholds) has the
query row only, with zero profile and flag 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from protein.residues import ALPHABET_SIZE, UNKNOWN_ID

MSA_FEATURES = 2 * ALPHABET_SIZE + 1
"""Channels per MSA row and residue: one-hot (21), profile (21), has-profile flag (1)."""


def msa_features(residues: torch.Tensor, profile: torch.Tensor | None, rows: int,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """residues (L,) ids, profile (L, 20) frequencies or None -> msa (S, L, MSA_FEATURES) float32 and
    msa_mask (S, L) float32 with S = rows (1 without a profile)."""
    length = residues.shape[0]
    if rows < 1:
        raise ValueError(f"rows must be >= 1; got {rows}")
    if profile is not None and profile.shape != (length, ALPHABET_SIZE - 1):
        raise ValueError(f"profile must be (L, {ALPHABET_SIZE - 1}) = ({length}, {ALPHABET_SIZE - 1}); got {tuple(profile.shape)}")
    if profile is None:
        sampled = residues[None]
        profile_channels = torch.zeros(1, length, ALPHABET_SIZE)
        flag = torch.zeros(1, length, 1)
    else:
        probabilities = profile.float().clamp_min(0) + 1e-6  # a column of zeros samples uniformly
        draws = torch.multinomial(probabilities, rows - 1, replacement=True, generator=generator).T  # (S-1, L)
        sampled = torch.cat([residues[None], draws])
        profile_channels = F.pad(profile.float(), (0, 1))[None].expand(rows, -1, -1)
        flag = torch.ones(rows, length, 1)
    one_hot = F.one_hot(sampled, ALPHABET_SIZE).float()
    return torch.cat([one_hot, profile_channels, flag], dim=-1), torch.ones(sampled.shape)


def relative_positions(residue_index: torch.Tensor, clip: int) -> torch.Tensor:
    """(..., L) residue numbers -> (..., L, L) long class of j - i clipped to [-clip, clip], in [0, 2 clip]."""
    return (residue_index[..., None, :] - residue_index[..., :, None]).clamp(-clip, clip) + clip


def target_features(residues: torch.Tensor) -> torch.Tensor:
    """(..., L) residue ids -> (..., L, 21) one-hot."""
    return F.one_hot(residues.clamp(0, UNKNOWN_ID), ALPHABET_SIZE).float()
