"""Rotary position embedding against Hugging Face Llama's, and its relative-position property."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from zoo.nn.rotary import apply_rotary, rotary_tables
from zoo.parity import relative_error


def test_rotation_matches_llama_and_depends_only_on_the_offset():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 12, 16, generator=g, dtype=torch.float64), torch.randn(2, 3, 12, 16, generator=g, dtype=torch.float64)
    cos, sin = rotary_tables(12, 16, dtype=torch.float64)
    theirs_q, theirs_k = apply_rotary_pos_emb(q, k, torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None])
    assert relative_error(apply_rotary(q, cos, sin), theirs_q) < 1e-14
    assert relative_error(apply_rotary(k, cos, sin), theirs_k) < 1e-14
    # The same vectors at positions (i, j) and (i + 5, j + 5) have the same dot product.
    x = q[:, :, :1].expand(-1, -1, 12, -1)
    y = k[:, :, :1].expand(-1, -1, 12, -1)
    dots = (apply_rotary(x, cos, sin)[:, :, :, None] * apply_rotary(y, cos, sin)[:, :, None]).sum(-1)
    assert torch.allclose(dots[:, :, 2, 4], dots[:, :, 7, 9]) and not torch.allclose(dots[:, :, 2, 4], dots[:, :, 2, 5])
    with pytest.raises(ValueError, match="even head dimension"):
        rotary_tables(4, 15)
