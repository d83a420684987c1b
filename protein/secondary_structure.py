"""Three-state secondary structure (helix, strand, coil) from DSSP letters: the auxiliary target of
the folding model and the states of the trivial baselines."""

from __future__ import annotations

import torch

STATES = "HEC"
"""Three-state secondary structure: helix, strand, coil; a state's id is its position."""
SECONDARY_STRUCTURE_STATES = len(STATES)
DSSP_TO_STATE = {"H": "H", "G": "H", "I": "H", "E": "E", "B": "E"}
"""DSSP letters reduced to three states (the usual reduction); any other letter is coil."""
IGNORE_INDEX = -100
"""Label of a residue without a state (padding), as in Hugging Face labels."""


def three_states(dssp: str) -> str:
    """DSSP letters -> H / E / C per residue."""
    return "".join(DSSP_TO_STATE.get(letter, "C") for letter in dssp)


def three_state_ids(states: str) -> torch.Tensor:
    """Three-state letters (L) -> (L,) long ids (H, E, C = 0, 1, 2); ValueError naming any other letter."""
    unknown = sorted(set(states) - set(STATES))
    if unknown:
        raise ValueError(f"states must be letters of {STATES!r}; got {unknown}")
    return torch.tensor([STATES.index(state) for state in states], dtype=torch.long)


def state_ids(dssp: str) -> torch.Tensor:
    """DSSP letters (L) -> (L,) long three-state ids (H, E, C = 0, 1, 2)."""
    return three_state_ids(three_states(dssp))
