"""zoo.nn.attention: SDPA and the chunked CPU dropout path against a float64 math reference."""

import math

import pytest
import torch

from trainers.memory.saved_activations import SavedActivations
from zoo.nn import chunk_memory
from zoo.nn.attention import SelfAttention, attention
from zoo.parity import relative_error


def reference(q, k, v, causal, key_padding_mask):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def qkv(kv_heads, seed, dtype=torch.float32, length=13):
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 4, length, 16), (2, kv_heads, length, 16), (2, kv_heads, length, 16))
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in shapes]


def padding():
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 9:] = False
    return mask


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_attention_matches_float64(kv_heads, causal, masked, dtype, tolerance):
    tensors = qkv(kv_heads, seed=kv_heads * 4 + causal * 2 + masked, dtype=dtype)
    mask = padding() if masked else None
    out = attention(*tensors, causal=causal, key_padding_mask=mask)
    refs = [t.detach().double().requires_grad_() for t in tensors]
    expected = reference(*refs, causal, mask)
    grad = torch.randn(expected.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    out.backward(grad.to(dtype))
    expected.backward(grad)
    assert out.dtype == dtype
    assert relative_error(out, expected) < tolerance
    for mine, theirs in zip(tensors, refs):
        assert relative_error(mine.grad, theirs.grad) < tolerance * 2


@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("chunk_rows", [None, 2])
def test_chunked_dropout_path_has_exact_gradients(kv_heads, chunk_rows):
    """Attention dropout on CPU: float64 gradcheck with the mask regenerated from the seed, in one
    chunk and in chunks of 2 query rows (a causal chunk computing only the keys it sees)."""
    tensors = [t.detach().double()[..., :6, :4].contiguous().requires_grad_() for t in qkv(kv_heads, 3)]
    mask = padding()[:, :6]
    mask[1, 4:] = False

    def run(*args):
        torch.manual_seed(11)
        return attention(*args, causal=True, key_padding_mask=mask, dropout_p=0.3)

    chunk_memory.set_chunk_bytes(None if chunk_rows is None else chunk_rows * 4 * 2 * 4 * 6)
    try:
        assert torch.autograd.gradcheck(run, tensors)
    finally:
        chunk_memory.set_chunk_bytes(None)


@pytest.mark.parametrize("batched", [False, True])
def test_an_attention_mask_matches_float64_and_its_dropout_path_has_exact_gradients(batched):
    """attn_mask (Sq, Skv) or (B, Sq, Skv), with a key padding mask: against masked float64 scores,
    and gradcheck of the chunked dropout path, which takes the mask as a per-row bias."""
    q, k, v = qkv(2, seed=7)
    chunk = torch.arange(13) // 4
    rows = (chunk[None, :] <= chunk[:, None]) & (chunk[None, :] >= chunk[:, None] - 1)  # chunk-wise, 1 chunk back
    attn_mask = torch.stack([rows, rows.tril()]) if batched else rows
    out = attention(q, k, v, key_padding_mask=padding(), attn_mask=attn_mask)
    groups = 2
    ke, ve = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    scores = q.double() @ ke.transpose(-1, -2) / 4.0
    allowed = padding()[:, None, None, :] & (attn_mask[:, None] if batched else attn_mask)
    expected = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ ve
    assert relative_error(out, expected) < 1e-5
    small = [t.detach().double()[..., :6, :4].contiguous().requires_grad_() for t in (q, k, v)]

    def run(*args):
        torch.manual_seed(3)
        return attention(*args, key_padding_mask=padding()[:, :6], attn_mask=attn_mask[..., :6, :6], dropout_p=0.3)

    assert torch.autograd.gradcheck(run, small)
    with pytest.raises(ValueError, match="attn_mask must be bool"):
        attention(q, k, v, attn_mask=rows[:5])


def test_attention_dropout_statistics_and_reproducibility():
    q, k, v = qkv(4, 1, length=64)
    ones = torch.ones_like(v)
    torch.manual_seed(4)
    first = attention(q, k, ones, dropout_p=0.2)  # each output = sum of kept probabilities / 0.8
    torch.manual_seed(4)
    assert torch.equal(first, attention(q, k, ones, dropout_p=0.2))
    assert abs(first.mean().item() - 1.0) < 0.02
    assert first.std().item() > 0.05


def test_chunked_dropout_saves_no_probabilities():
    q, k, v = qkv(4, 2, length=256)
    with SavedActivations() as saved:
        attention(q, k, v, dropout_p=0.1, causal=True)
    score_bytes = 2 * 4 * 256 * 256 * 4
    assert saved.bytes < score_bytes / 2
    assert saved.bytes == 4 * q.numel() * 4 + 2 * 4 * 256 * 4  # q, k, v, output; float32 lse


def test_self_attention_layer_gqa_shapes_and_errors():
    layer = SelfAttention(64, heads=8, kv_heads=2, causal=True)
    assert (layer.q.out_features, layer.k.out_features, layer.v.out_features) == (8 * 8, 2 * 8, 2 * 8)
    q, k, v = layer.project(torch.randn(3, 5, 64))
    assert q.shape == (3, 8, 5, 8) and k.shape == v.shape == (3, 2, 5, 8)
    assert layer(torch.randn(3, 5, 64)).shape == (3, 5, 64)
    with pytest.raises(ValueError, match=r"kv_heads \(3\) must divide heads \(8\)"):
        SelfAttention(64, heads=8, kv_heads=3)
    with pytest.raises(ValueError, match=r"heads \(5\) must divide width \(64\)"):
        SelfAttention(64, heads=5)
    q, k, v = qkv(3, 0)[0], *qkv(3, 0)[1:]
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        attention(q, k, v)
    q, k, v = qkv(4, 0)
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        attention(q, k, v, key_padding_mask=torch.ones(2, 12, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask must be bool"):
        attention(q, k, v, key_padding_mask=torch.ones(2, 13))
    with pytest.raises(TypeError, match="share one floating dtype"):
        attention(q, k.double(), v)


def test_self_attention_loads_a_fused_qkv_checkpoint():
    """Checkpoints from before the projections were split hold one qkv.* with rows [q | k | v]."""
    torch.manual_seed(5)
    layer = SelfAttention(32, heads=4, kv_heads=2)
    state = {k: v for k, v in layer.state_dict().items() if k.startswith("out.")}
    for kind in ("weight", "bias"):
        state[f"qkv.{kind}"] = torch.cat([layer.state_dict()[f"{name}.{kind}"] for name in "qkv"])
    fresh = SelfAttention(32, heads=4, kv_heads=2)
    fresh.load_state_dict(state)
    x = torch.randn(2, 7, 32)
    assert torch.equal(fresh(x), layer(x))
