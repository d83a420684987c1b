"""GPT against a float64 reference computed from its own weights, its plan, and KV-cache generation."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import tiny_gpt
from nlp.sampling import Sampling, next_token
from zoo.parity import relative_error


def reference_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The GPT forward written out in float64 with explicit attention (no SDPA), any kv heads."""
    p = {k: v.double() for k, v in model.state_dict().items()}
    heads, kv_heads = model.config.n_head, model.config.n_kv_head or model.config.n_head
    dim = model.config.n_embd // heads

    def norm(x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], p[f"{name}.weight"], p.get(f"{name}.bias"))

    length = ids.shape[1]
    x = p["embeddings.word.weight"][ids] + p["embeddings.position.weight"][:length]
    for i in range(model.config.n_layer):
        b = f"blocks.{i}"
        q, k, v = (norm(x, f"{b}.norm1") @ p[f"{b}.attn.{name}.weight"].T for name in "qkv")
        split = lambda t: t.unflatten(-1, (-1, dim)).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k).repeat_interleave(heads // kv_heads, 1), split(v).repeat_interleave(heads // kv_heads, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim)
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
        x = x + y @ p[f"{b}.attn.out.weight"].T
        h = norm(x, f"{b}.norm2") @ p[f"{b}.mlp.fc1.weight"].T
        x = x + torch.nn.functional.gelu(h, approximate="tanh") @ p[f"{b}.mlp.fc2.weight"].T
    return norm(x, "norm") @ p["embeddings.word.weight"].T


@pytest.mark.parametrize("kv_heads", [None, 1, 2])
def test_forward_matches_float64_reference(kv_heads):
    model = tiny_gpt(n_head=4, n_kv_head=kv_heads)
    ids = torch.randint(0, model.config.vocab_size, (3, 16), generator=torch.Generator().manual_seed(4))
    assert relative_error(model(ids)["logits"], reference_logits(model, ids)) < 1e-5


@pytest.mark.parametrize("kv_heads,kv_rows", [(None, 32), (2, 16), (1, 8)])
def test_multi_and_grouped_query_shapes(kv_heads, kv_rows):
    model = tiny_gpt(n_head=4, n_kv_head=kv_heads)
    attn = model.blocks[0].attn
    assert attn.q.weight.shape == (32, 32) and attn.k.weight.shape == attn.v.weight.shape == (kv_rows, 32)
    cache = model.new_cache(batch=2)
    assert cache.keys.shape == (2, 2, kv_heads or 4, 16, 8)
    with pytest.raises(ValueError, match="n_kv_head must divide n_head=4; got 3"):
        tiny_gpt(n_head=4, n_kv_head=3)


@pytest.mark.parametrize("skip_logits", [None, False], ids=["fused-in-training", "with-logits"])
def test_hf_style_loss_and_gradients_match_the_reference(skip_logits):
    """labels unshifted as in Hugging Face (the model shifts them), -100 ignored; training takes the
    fused path (loss only) unless skip_logits=False."""
    model = tiny_gpt()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(5))
    labels = ids.clone()
    labels[0, :4] = -100
    out = model(ids, labels=labels, skip_logits=skip_logits)
    assert set(out) == ({"loss"} if skip_logits is None else {"loss", "logits"})
    out["loss"].backward()
    params64 = {k: v.detach().double().requires_grad_() for k, v in model.state_dict().items()}

    class Weights:  # the reference reads a state dict; hand it the float64 leaves
        config = model.config

        @staticmethod
        def state_dict():
            return params64

    logits = reference_logits(Weights, ids)
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    expected.backward()
    assert abs(out["loss"].item() - expected.item()) < 1e-5 * expected.item()
    if skip_logits is False:
        assert relative_error(out["logits"], logits) < 1e-5
    for name, param in model.named_parameters():
        assert relative_error(param.grad, params64[name].grad) < 1e-5, name


def test_outputs_follow_hugging_face_in_eval_and_the_fused_path_is_chosen_explicitly():
    model = tiny_gpt().eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(8))
    full = model(ids, labels=ids)
    assert set(full) == {"loss", "logits"} and full["logits"].shape == (2, 16, model.config.vocab_size)
    fused = model(ids, labels=ids, skip_logits=True)
    assert set(fused) == {"loss"} and abs(fused["loss"].item() - full["loss"].item()) < 1e-5
    assert set(model(ids)) == {"logits"}
    with pytest.raises(ValueError, match="skip_logits=True returns only the loss, which needs labels"):
        model(ids, skip_logits=True)


def test_errors_are_named():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="length must be <= block_size=16; got 17"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must have the shape of input_ids \(1, 4\); got \(1, 3\)"):
        model(torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, 3, dtype=torch.long))
    cache = model.new_cache(batch=1)
    model.hidden_states(torch.zeros(1, 10, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"got 17 \(10 cached\)"):
        model.hidden_states(torch.zeros(1, 7, dtype=torch.long), cache)


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_cached_decoding_equals_the_full_forward(kv_heads):
    model = tiny_gpt(n_head=4, n_kv_head=kv_heads, bias=True)
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(6))
    full = model.hidden_states(ids)
    cache = model.new_cache(batch=2)
    pieces = [model.hidden_states(ids[:, :5], cache)] + [model.hidden_states(ids[:, t : t + 1], cache) for t in range(5, 16)]
    assert cache.length == 16
    assert relative_error(torch.cat(pieces, dim=1), full) < 1e-6


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, top_k=5), dict(temperature=1.2, top_p=0.8)])
def test_generation_with_and_without_cache_gives_the_same_tokens(sampling):
    model = tiny_gpt(n_head=4, n_kv_head=2)
    prompt = torch.randint(0, model.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(7))
    # 20 new tokens run past block_size=16, where the cached path switches to windowed full forwards.
    cached = model.generate(prompt, 20, **sampling, generator=torch.Generator().manual_seed(1))
    plain = model.generate(prompt, 20, **sampling, generator=torch.Generator().manual_seed(1), use_cache=False)
    assert cached.shape == (3, 24) and torch.equal(cached[:, :4], prompt)
    assert torch.equal(cached, plain)


def test_greedy_generation_follows_argmax():
    model = tiny_gpt()
    prompt = torch.tensor([[1, 2, 3]])
    out = model.generate(prompt, 4, temperature=0)
    assert out[0, 3].item() == model(prompt)["logits"][0, -1].argmax().item()


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draws = lambda s: {next_token(logits, s, torch.Generator().manual_seed(i)).item() for i in range(200)}  # noqa: E731
    assert draws(Sampling(top_k=2)) == {0, 1}
    assert draws(Sampling(top_p=0.8)) == {0, 1}  # 0.5 + 0.3 reaches 0.8
    assert draws(Sampling(top_p=0.81)) == {0, 1, 2}
    assert draws(Sampling(temperature=0)) == {0}
    with pytest.raises(ValueError, match="top_p must be in \\(0, 1\\] or None; got 1.5"):
        Sampling(top_p=1.5)
