"""Evoformer modules against float64 references written residue by residue from the AlphaFold
algorithms; chunked == unchunked; bf16 autocast within tolerance of float32; shared dropout."""

import copy

import pytest
import torch

from protein.evoformer import (EvoformerBlock, EvoformerConfig, MSAColumnAttention, MSARowAttention,
                               OuterProductMean, TriangleAttention, TriangleMultiplication)
from trainers.memory.saved_activations import SavedActivations
from zoo.parity import relative_error

CONFIG = EvoformerConfig(msa_dim=8, pair_dim=6, msa_heads=2, pair_heads=2, head_dim=4, outer_product_dim=3,
                         triangle_dim=5, msa_dropout=0.0, pair_dropout=0.0)
B, S, L = 2, 3, 5


def randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The module with every parameter redrawn (AlphaFold's zero inits would hide most paths)."""
    torch.manual_seed(seed)
    for p in module.parameters():
        p.data.normal_(0.0, 0.5)
    return module


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    msa, pair = torch.randn(B, S, L, CONFIG.msa_dim, generator=g), torch.randn(B, L, L, CONFIG.pair_dim, generator=g)
    msa_mask = torch.ones(B, S, L)
    msa_mask[1, :, 3:] = 0  # the second example has 3 residues
    msa_mask[1, 2] = 0  # and 2 MSA rows
    return msa, pair, msa_mask, msa_mask[:, 0, :, None] * msa_mask[:, 0, None, :]


def ln(norm, x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def gated_attention(attention, x_i, keys, biases, mask):
    """One query x_i (C,) over keys (N, C) with per-head biases (H, N) and a key mask (N,)."""
    h, c = attention.heads, attention.head_dim
    q = (attention.qkv.weight[: h * c] @ x_i).view(h, c)
    k = (keys @ attention.qkv.weight[h * c : 2 * h * c].T).view(-1, h, c)
    v = (keys @ attention.qkv.weight[2 * h * c :].T).view(-1, h, c)
    logits = torch.einsum("hc,nhc->hn", q, k) / c**0.5 + biases + (mask - 1) * 1e9
    o = torch.einsum("hn,nhc->hc", logits.softmax(-1), v).flatten()
    return attention.out(o * torch.sigmoid(attention.gate(x_i)))


def reference_row_attention(module, msa, pair, msa_mask):
    out = torch.zeros_like(msa)
    for b in range(B):
        bias = module.pair_bias(ln(module.pair_norm, pair[b])).permute(2, 0, 1)  # (H, i, j)
        for s in range(S):
            m = ln(module.norm, msa[b, s])
            for i in range(L):
                out[b, s, i] = gated_attention(module.attention, m[i], m, bias[:, i], msa_mask[b, s])
    return out


def reference_column_attention(module, msa, msa_mask):
    out = torch.zeros_like(msa)
    for b in range(B):
        for i in range(L):
            m = ln(module.norm, msa[b, :, i])
            for s in range(S):
                out[b, s, i] = gated_attention(module.attention, m[s], m, torch.zeros(1, S, dtype=m.dtype),
                                               msa_mask[b, :, i])
    return out


def reference_outer_product_mean(module, msa, msa_mask):
    out = torch.zeros(B, L, L, CONFIG.pair_dim, dtype=msa.dtype)
    for b in range(B):
        m = ln(module.norm, msa[b])
        a, c = module.a(m), module.b(m)
        for i in range(L):
            for j in range(L):
                rows = [s for s in range(S) if msa_mask[b, s, i] and msa_mask[b, s, j]]
                outer = sum((torch.outer(a[s, i], c[s, j]) for s in rows), torch.zeros(3, 3, dtype=msa.dtype))
                out[b, i, j] = module.out(outer.flatten()) / (len(rows) + 1e-3)
    return out


def reference_triangle_multiplication(module, pair, pair_mask):
    out = torch.zeros_like(pair)
    for b in range(B):
        z = ln(module.norm, pair[b])
        a, c = (module.projection(z) * torch.sigmoid(module.projection_gate(z)) * pair_mask[b, ..., None]).chunk(2, -1)
        for i in range(L):
            for j in range(L):
                edges = sum(a[i, k] * c[j, k] if module.outgoing else a[k, i] * c[k, j] for k in range(L))
                out[b, i, j] = torch.sigmoid(module.gate(z[i, j])) * module.out(ln(module.out_norm, edges))
    return out


def reference_triangle_attention(module, pair, pair_mask):
    out = torch.zeros_like(pair)
    for b in range(B):
        z = ln(module.norm, pair[b] if module.starting else pair[b].transpose(0, 1))
        mask = pair_mask[b] if module.starting else pair_mask[b].T
        bias = module.bias(z).permute(2, 0, 1)  # (H, j, k)
        for i in range(L):
            for j in range(L):
                value = gated_attention(module.attention, z[i, j], z[i], bias[:, j], mask[i])
                if module.starting:
                    out[b, i, j] = value
                else:
                    out[b, j, i] = value
    return out


CASES = {
    "row_attention": (lambda: MSARowAttention(CONFIG), reference_row_attention, "msa_pair"),
    "column_attention": (lambda: MSAColumnAttention(CONFIG), reference_column_attention, "msa"),
    "outer_product_mean": (lambda: OuterProductMean(CONFIG), reference_outer_product_mean, "msa"),
    "triangle_outgoing": (lambda: TriangleMultiplication(CONFIG, outgoing=True), reference_triangle_multiplication, "pair"),
    "triangle_incoming": (lambda: TriangleMultiplication(CONFIG, outgoing=False), reference_triangle_multiplication, "pair"),
    "triangle_starting": (lambda: TriangleAttention(CONFIG, starting=True), reference_triangle_attention, "pair"),
    "triangle_ending": (lambda: TriangleAttention(CONFIG, starting=False), reference_triangle_attention, "pair"),
}


def arguments(kind, msa, pair, msa_mask, pair_mask):
    return {"msa_pair": (msa, pair, msa_mask), "msa": (msa, msa_mask), "pair": (pair, pair_mask)}[kind]


@pytest.mark.parametrize("name", list(CASES))
def test_module_matches_float64_reference_values_and_gradients(name):
    build, reference, kind = CASES[name]
    module = randomised(build(), seed=1)
    exact = copy.deepcopy(module).double()
    msa, pair, msa_mask, pair_mask = inputs(2)
    args = [a.requires_grad_(a.shape[-1] > L) for a in arguments(kind, msa, pair, msa_mask, pair_mask)]  # not masks
    args64 = [a.detach().double().requires_grad_(a.requires_grad) for a in args]
    out, expected = module(*args), reference(exact, *args64)
    # A query whose keys are all masked has no defined attention (a softmax of -1e9s): compare the rest.
    present = (pair_mask if out.shape[1:3] == (L, L) else msa_mask)[..., None]
    out, expected = out * present, expected * present
    assert relative_error(out, expected) < 1e-5
    grad = torch.randn_like(expected)
    out.backward(grad.float())
    expected.backward(grad)
    for a, a64 in zip(args, args64):
        if a.requires_grad:
            assert relative_error(a.grad, a64.grad) < 1e-5
    for (pname, p), p64 in zip(module.named_parameters(), exact.parameters()):
        if p64.grad.norm() < 1e-12:  # exactly zero in exact arithmetic (a bias every logit of a row shares)
            assert p.grad.abs().max() < 1e-5, pname
        else:
            assert relative_error(p.grad, p64.grad) < 1e-5, pname


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("name", [name for name in CASES if "attention" in name])
def test_attention_without_gradients_takes_sdpa_fused_kernel_and_matches_float64_reference(name, padded):
    """Folding runs without gradients: there the attentions' (B, rows, H, L, c) inputs are merged to
    4-D, so CPU SDPA takes its flash kernel, not the math path that materialises the logits, with
    keys masked (padded) or not."""
    build, reference, kind = CASES[name]
    module = randomised(build(), seed=5)
    msa, pair, msa_mask, pair_mask = inputs(6)
    if not padded:
        msa_mask, pair_mask = torch.ones_like(msa_mask), torch.ones_like(pair_mask)
    args = arguments(kind, msa, pair, msa_mask, pair_mask)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        out = module(*args)
    kernels = {event.key for event in profile.key_averages() if "scaled_dot_product" in event.key}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels, kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels, kernels
    expected = reference(copy.deepcopy(module).double(), *(a.double() for a in args))
    present = (pair_mask if out.shape[1:3] == (L, L) else msa_mask)[..., None]
    assert relative_error(out * present, expected * present) < 1e-5


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_chunked_block_equals_unchunked(chunk):
    """Chunking is exact arithmetic reordered: in float64 the outputs agree to rounding (float32's
    rounding, 1e-7 relative, depends on the CPU's vector width)."""
    block = randomised(EvoformerBlock(CONFIG), seed=3).eval().double()
    msa, pair, msa_mask, pair_mask = (t.double() if t.is_floating_point() else t for t in inputs(4))
    whole = block(msa, pair, msa_mask, pair_mask)
    parts = block(msa, pair, msa_mask, pair_mask, chunk_size=chunk)
    for x, y in zip(whole, parts):
        assert relative_error(y, x) < 1e-14


def test_bf16_autocast_is_within_bf16_tolerance_of_float32():
    block = randomised(EvoformerBlock(CONFIG), seed=5).eval()
    msa, pair, msa_mask, pair_mask = inputs(6)
    with torch.no_grad():
        full = block(msa.clone(), pair.clone(), msa_mask, pair_mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = block(msa.clone(), pair.clone(), msa_mask, pair_mask)
    for x, y in zip(half, full):
        assert relative_error(x, y) < 3e-2


def test_no_grad_updates_in_place_and_the_seed_fixes_dropout():
    block = randomised(EvoformerBlock(CONFIG), seed=7).eval()
    msa, pair, msa_mask, pair_mask = inputs(8)
    with torch.no_grad():
        out_msa, out_pair = block(msa, pair, msa_mask, pair_mask)
    assert out_msa.data_ptr() == msa.data_ptr() and out_pair.data_ptr() == pair.data_ptr()  # consumed in place
    config = EvoformerConfig(**{**CONFIG.__dict__, "pair_dropout": 0.5})
    block = randomised(EvoformerBlock(config), seed=9).train()
    msa, pair, msa_mask, pair_mask = inputs(10)
    torch.manual_seed(0)
    first = block(msa, pair, msa_mask, pair_mask)
    torch.manual_seed(0)
    second = block(msa, pair, msa_mask, pair_mask)
    assert torch.equal(first[1], second[1])  # the seed fixes the masks


def test_chunked_training_keeps_fewer_activations_and_the_same_gradients():
    block = randomised(EvoformerBlock(CONFIG), seed=11).train()
    msa, pair, msa_mask, pair_mask = inputs(12)
    results = []
    for chunk in (None, 1):
        block.zero_grad()
        with SavedActivations(exclude=block.parameters()) as saved:
            out_msa, out_pair = block(msa, pair, msa_mask, pair_mask, chunk_size=chunk)
        (out_msa.square().sum() + out_pair.square().sum()).backward()
        results.append((saved.bytes, [p.grad.clone() for p in block.parameters()]))
    (whole, whole_grads), (chunked_bytes, chunked_grads) = results
    assert chunked_bytes < 0.6 * whole
    # Relative to the largest gradient: the pair-norm bias of row attention has an exactly-zero gradient.
    scale = max(g.norm() for g in whole_grads)
    assert all((a - b).norm() < 1e-5 * scale for a, b in zip(whole_grads, chunked_grads))
