"""GPT against a float64 reference computed from its own weights, and generation."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import relative_error, tiny_gpt


def reference_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The GPT forward written out in float64 with explicit attention (no SDPA)."""
    p = {k: v.double() for k, v in model.state_dict().items()}
    heads = model.config.n_head

    def norm(x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], p[f"{name}.weight"], p.get(f"{name}.bias"))

    length = ids.shape[1]
    x = p["wte.weight"][ids] + p["wpe.weight"][:length]
    for i in range(model.config.n_layer):
        b = f"blocks.{i}"
        q, k, v = (norm(x, f"{b}.ln_1") @ p[f"{b}.attn.qkv.weight"].T).chunk(3, dim=-1)
        split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
        x = x + y @ p[f"{b}.attn.proj.weight"].T
        h = norm(x, f"{b}.ln_2") @ p[f"{b}.mlp.fc.weight"].T
        x = x + torch.nn.functional.gelu(h, approximate="tanh") @ p[f"{b}.mlp.proj.weight"].T
    return norm(x, "ln_f") @ p["wte.weight"].T


def test_forward_matches_float64_reference():
    model = tiny_gpt()
    ids = torch.randint(0, model.config.vocab_size, (3, 16), generator=torch.Generator().manual_seed(4))
    assert relative_error(model(ids)["logits"], reference_logits(model, ids)) < 1e-5


def test_loss_is_cross_entropy_of_next_tokens_and_errors_are_named():
    model = tiny_gpt()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(5))
    out = model(ids[:, :-1], labels=ids[:, 1:])
    expected = torch.nn.functional.cross_entropy(reference_logits(model, ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    assert abs(out["loss"].item() - expected.item()) < 1e-5 * expected.item()
    with pytest.raises(ValueError, match="length must be <= block_size=16; got 17"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_greedy_generation_follows_argmax():
    model = tiny_gpt()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 4, temperature=0)
    assert out.shape == (1, 7) and torch.equal(out[:, :3], prompt)
    assert out[0, 3].item() == model(prompt)["logits"][0, -1].argmax().item()
