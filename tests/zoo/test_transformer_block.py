"""zoo.nn.block and zoo.nn.embedding: parity with plain float64 PyTorch, exact recompute, saved bytes."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainers.memory.saved_activations import SavedActivations
from zoo.nn.block import TransformerBlock, TransformerBlockConfig, block_plan
from zoo.nn.embedding import Embeddings
from zoo.parity import relative_error

ACT = {"gelu": F.gelu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "silu": F.silu, "relu": F.relu}


def reference_block(block: TransformerBlock, p: dict[str, torch.Tensor], x, mask):
    """The same block written with plain PyTorch ops (no dropout) on the parameters `p`."""
    c = block.config

    def norm(h, prefix):
        if c.norm == "layer":
            return F.layer_norm(h, (c.width,), p[f"{prefix}.weight"], p.get(f"{prefix}.bias"), c.eps)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + c.eps) * p[f"{prefix}.weight"]

    def attend(h):
        heads, kv, d = block.attn.heads, block.attn.kv_heads, block.attn.head_dim
        q, k, v = (F.linear(h, p[f"attn.{name}.weight"], p.get(f"attn.{name}.bias")).unflatten(-1, (-1, d)).transpose(1, 2)
                   for name in "qkv")
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        if c.causal:
            scores = scores.masked_fill(torch.ones(h.shape[1], h.shape[1], dtype=torch.bool).triu(1), float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)
        return F.linear(y, p["attn.out.weight"], p.get("attn.out.bias"))

    def mlp(h):
        z = ACT[c.activation](F.linear(h, p["mlp.fc1.weight"], p.get("mlp.fc1.bias")))
        return F.linear(z, p["mlp.fc2.weight"], p.get("mlp.fc2.bias"))

    if c.prenorm:
        x = x + attend(norm(x, "norm1"))
        return x + mlp(norm(x, "norm2"))
    x = norm(x + attend(x), "norm1")
    return norm(x + mlp(x), "norm2")


CONFIGS = [
    TransformerBlockConfig(width=64, heads=4, prenorm=True, causal=True, activation="gelu_tanh"),
    TransformerBlockConfig(width=64, heads=4, prenorm=False, activation="gelu", eps=1e-12),
    TransformerBlockConfig(width=64, heads=8, kv_heads=2, norm="rms", bias=False, activation="silu", mlp_ratio=2.5),
    TransformerBlockConfig(width=64, heads=4, kv_heads=1, prenorm=False, activation="relu", recompute_attention=True),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{'pre' if c.prenorm else 'post'}-{c.norm}-{c.activation}-kv{c.kv_heads}")
def test_block_matches_float64_reference(config):
    torch.manual_seed(0)
    block = TransformerBlock(config)
    with torch.no_grad():  # non-trivial norm affine parameters
        for name, param in block.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    x = torch.randn(2, 10, 64, requires_grad=True)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, 7:] = False
    out = block(x, mask)
    x64 = x.detach().double().requires_grad_()
    params64 = {n: p.detach().double().requires_grad_() for n, p in block.named_parameters()}
    expected = reference_block(block, params64, x64, mask)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad.double())
    assert relative_error(out, expected) < 1e-5
    assert relative_error(x.grad, x64.grad) < 1e-5
    for name, param in block.named_parameters():
        if name == "attn.k.bias":  # shifts every score of a query equally: its gradient is zero up to rounding
            assert param.grad.abs().max() < 1e-5 * block.attn.q.bias.grad.abs().max()
            continue
        assert relative_error(param.grad, params64[name].grad) < 1e-5, name


@pytest.mark.parametrize("config", [c for c in CONFIGS if not c.causal],
                         ids=lambda c: f"{'pre' if c.prenorm else 'post'}-{c.norm}-kv{c.kv_heads}")
def test_rows_give_those_positions_of_the_whole_block(config):
    """rows=slice(3, 6): the three positions' outputs, and every gradient, as the float64 block's."""
    torch.manual_seed(1)
    block = TransformerBlock(config)
    x = torch.randn(2, 10, 64, requires_grad=True)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 8:] = False
    out = block(x, mask, rows=slice(3, 6))
    x64 = x.detach().double().requires_grad_()
    params64 = {n: p.detach().double().requires_grad_() for n, p in block.named_parameters()}
    expected = reference_block(block, params64, x64, mask)[:, 3:6]
    assert out.shape == (2, 3, 64) and relative_error(out, expected) < 1e-5
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad.double())
    assert relative_error(x.grad, x64.grad) < 1e-5
    for name, param in block.named_parameters():
        if name != "attn.k.bias":  # zero up to rounding (see the test above)
            assert relative_error(param.grad, params64[name].grad) < 1e-5, name


def test_rows_are_refused_where_queries_must_be_the_last_positions():
    block = TransformerBlock(CONFIGS[0])  # causal
    refusal = r"rows=slice\(0, 1, None\) needs a non-causal layer without a cache; got causal=True"
    with pytest.raises(ValueError, match=refusal):
        block(torch.randn(1, 4, 64), rows=slice(0, 1))


@pytest.mark.parametrize("prenorm", [True, False])
def test_checkpoint_recompute_is_bit_identical_with_dropout(prenorm):
    config = TransformerBlockConfig(width=64, heads=4, prenorm=prenorm, dropout=0.2, attention_dropout=0.2)
    torch.manual_seed(0)
    block = TransformerBlock(config)
    x = torch.randn(2, 12, 64)
    results = []
    for mode in ("plain", "checkpoint", "recompute_attention"):
        block.zero_grad()
        block.config.recompute_attention = mode == "recompute_attention"
        inp = x.clone().requires_grad_()
        torch.manual_seed(42)
        out = checkpoint(block, inp, use_reentrant=False) if mode == "checkpoint" else block(inp)
        out.pow(2).sum().backward()
        results.append([out.detach(), inp.grad] + [p.grad.clone() for p in block.parameters()])
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
    torch.manual_seed(43)
    assert not torch.equal(block(x), results[0][0])  # another seed, other masks


def test_saved_bytes_per_block_follow_the_formula():
    """Pre-LN: norm1 out, qkv, attention out, norm2 out, fc1 out (+ float32 rstd x2 and lse); with
    `rows`, all but norm1's output and rstd and the keys and values only for those positions, and
    the query projection's input, those rows of norm1's output, copied (a batch's rows are no one
    stretch of memory)."""
    batch, length, width, heads, rows = 2, 32, 64, 4, 5
    for recompute in (False, True):
        block = TransformerBlock(TransformerBlockConfig(width=width, heads=heads, dropout=0.1, recompute_attention=recompute))
        x = torch.randn(batch, length, width, requires_grad=True)
        with SavedActivations(exclude=block.parameters()) as saved:
            block(x)
        with SavedActivations(exclude=block.parameters()) as saved_rows:
            block(x, rows=slice(0, rows))
        tokens, some = batch * length, batch * rows
        kept = (width + 3 * width + width + width + 4 * width) * tokens + 2 * tokens + heads * tokens
        kept_rows = (width + 2 * width + 1) * tokens + (width + 3 * width + 4 * width + 1 + heads) * some
        if recompute:
            kept = (width + width + width + 4 * width) * tokens + 2 * tokens
            kept_rows = (width + 1) * tokens + (width + width + 4 * width + 1) * some
        assert (saved.bytes, saved_rows.bytes) == (kept * 4, kept_rows * 4)


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_block_plan_names_the_parallel_linears(kv_heads):
    model = nn.Module()
    config = TransformerBlockConfig(width=32, heads=2, kv_heads=kv_heads)
    model.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(2))
    plan = block_plan("blocks.*", config)
    assert plan.block_names(model) == ["blocks.0", "blocks.1"]
    projections = "qkv" if kv_heads is None else "q"  # multi-query: the one key/value head is replicated
    assert plan.names(model, "colwise") == [f"blocks.{i}.{name}" for i in (0, 1) for name in
                                            [f"attn.{p}" for p in projections] + ["mlp.fc1"]]
    assert plan.names(model, "replicated") == ([] if kv_heads is None else
                                               [f"blocks.{i}.attn.{p}" for i in (0, 1) for p in "kv"])
    assert plan.names(model, "rowwise") == ["blocks.0.attn.out", "blocks.0.mlp.fc2", "blocks.1.attn.out", "blocks.1.mlp.fc2"]
    assert plan.names(model, "regions") == ["blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp"]
    assert plan.head_rows(model)["blocks.1.attn.q"] == 16
    with pytest.raises(ValueError, match="ModelPlan.colwise names 'blocks.0.norm1', a Norm; it must name Linear"):
        type(plan)(colwise=("blocks.*.norm1",)).names(model, "colwise")
    with pytest.raises(ValueError, match="ModelPlan.rowwise pattern 'blocks.*.fc9' matches no submodule"):
        type(plan)(rowwise=("blocks.*.fc9",)).names(model, "rowwise")


def test_embeddings_match_reference_and_check_length():
    torch.manual_seed(0)
    emb = Embeddings(50, 32, positions=16, token_types=2, norm=True)
    ids = torch.randint(0, 50, (3, 9))
    types = torch.randint(0, 2, (3, 9))
    out = emb(ids, token_type_ids=types)
    expected = F.layer_norm(emb.word.weight[ids] + emb.position.weight[:9] + emb.token_type.weight[types], (32,), eps=1e-12)
    assert relative_error(out, expected) < 1e-6
    out.pow(2).sum().backward()
    assert emb.word.weight.grad is not None and emb.norm.weight.grad is not None
    with pytest.raises(ValueError, match="exceeds the 16 learned positions"):
        emb(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("prenorm", [True, False])
def test_bfloat16_block_is_within_bfloat16_tolerance(prenorm):
    config = TransformerBlockConfig(width=64, heads=4, kv_heads=2, prenorm=prenorm, activation="gelu_tanh")
    torch.manual_seed(1)
    block = TransformerBlock(config)
    params64 = {n: p.detach().double().requires_grad_() for n, p in block.named_parameters()}
    block = block.to(torch.bfloat16)
    x = torch.randn(2, 16, 64)
    x16 = x.to(torch.bfloat16).requires_grad_()
    out = block(x16)
    x64 = x.double().requires_grad_()
    expected = reference_block(block, params64, x64, None)
    grad = torch.randn_like(expected)
    out.backward(grad.to(torch.bfloat16))
    expected.backward(grad)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, expected) < 2e-2
    assert relative_error(x16.grad, x64.grad) < 3e-2
    for name, param in block.named_parameters():
        if name == "attn.k.bias":  # zero gradient up to rounding (see above)
            assert param.grad.float().abs().max() < 3e-2 * block.attn.q.bias.grad.float().abs().max()
            continue
        assert relative_error(param.grad, params64[name].grad) < 3e-2, name
