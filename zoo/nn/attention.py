"""Attention through `scaled_dot_product_attention`, and the self-attention layer built on it.

`attention()` runs SDPA (flash / memory-efficient backends: saves q, k, v, the output and one
log-sum-exp per query) for causal and key-padding masks and multi-/grouped-query heads. One case
SDPA cannot serve without materialising the (B, H, S, S) probabilities: attention dropout on CPU,
where only the math backend supports it. There `attention()` runs a PyTorch flash-style function
(`_chunks_forward`): query chunks (a causal one computing only the keys its queries may see), a
float32 log-sum-exp, the dropout mask regenerated from a seed per chunk, and a backward that
recomputes each chunk's probabilities. It saves what SDPA's flash backend saves. Under
torch.compile it is one custom operator (`zoo::chunked_attention`), so that the compiled graph
saves no more.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zoo.nn.chunk_memory import rows_per_chunk
from zoo.nn.dropout import check_probability, draw_seed, drop_threshold, keep_mask, random_words_at
from zoo.nn.kv_cache import LayerKVCache
from zoo.nn.norm import Norm
from zoo.nn.rotary import apply_rotary

CAUSAL_CHUNKS = 8
"""The chunked path splits causal queries into at least this many chunks (of at least
`CAUSAL_CHUNK_FLOOR` rows): a causal chunk computes only the keys its queries may see, so of the
masked half of the scores all but 1/16 is skipped."""
CAUSAL_CHUNK_FLOOR = 64
"""Fewest query rows of a causal chunk (fewer spend more on each chunk's calls than they skip)."""


def _rows_dropped(shape: tuple[int, int, int, int], p: float, seed: int | torch.Tensor, start: int, visible: int,
                  device: torch.device) -> torch.Tensor:
    """Where dropout zeroes the (B, H, Sq, Sk) probabilities in query rows start .. start + shape[2]
    and keys 0 .. visible of shape[3] (bool (B, H, shape[2], visible), True = dropped): one mask
    laid out (Sq, B, H, Sk), so the same whatever the chunks and however many keys a chunk sees.
    With Sk a multiple of 4 (a word's four uniforms then lie in one row of keys) the words are
    hashed in the probabilities' own order, only those of the visible keys."""
    b, h, rows, keys = shape
    if keys % 4:
        keep = keep_mask((rows, b, h, keys), p, seed, device, offset=start * b * h * keys)
        return keep.logical_not_().permute(1, 2, 0, 3)[..., :visible]
    quarter, words = keys // 4, -(-visible // 4)
    row_starts = (torch.arange(b * h, device=device).view(b, h, 1, 1) * quarter
                  + torch.arange(start, start + rows, device=device).view(1, 1, rows, 1) * (b * h * quarter))
    index = torch.add(row_starts, torch.arange(words, device=device))  # the word of (row, b, h, 4 keys)
    uniforms = random_words_at(index, seed).view(torch.int16)[..., :visible]
    return uniforms < drop_threshold(p)


def _shifted_scores(q_chunk: torch.Tensor, k: torch.Tensor, start: int, bias: torch.Tensor | None, causal: bool,
                    sq: int, shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores - shift, shift) for the already scaled queries [start, start + c) of Sq = sq: a new
    (B, H, c, visible) tensor in k's dtype, -inf where masked, over the keys the chunk may see (all,
    or under causal those up to its last query, which sits at key start + c - 1 + Skv - Sq). shift
    (B, H, c) defaults to each row's largest score (0 for a row that sees no key)."""
    rows = q_chunk.shape[-2]
    visible = start + rows + k.shape[-2] - sq if causal else k.shape[-2]
    # The matmul's output is not modified: selective checkpointing keeps it and hands that same
    # tensor to the recompute.
    scores = q_chunk.to(k.dtype) @ k[:, :, :visible].transpose(-1, -2)
    # Under causal only the last `rows` visible keys can lie in a query's future: key first + j is
    # after query i of the chunk when j > i.
    first, future = visible - rows, torch.ones(rows, rows, dtype=torch.bool, device=k.device).triu_(1) if causal else None
    if bias is not None:
        scores = scores + (bias if bias.shape[-2] == 1 else bias[..., start : start + rows, :])[..., :visible]
        if causal:
            scores[..., first:].masked_fill_(future, float("-inf"))
    if shift is None:
        if causal and bias is None:
            shift = scores[..., first:].masked_fill(future, float("-inf")).amax(-1)
            if first:
                shift = torch.maximum(shift, scores[..., :first].amax(-1))
        else:
            shift = scores.amax(-1)
        shift = shift.nan_to_num_(neginf=0.0)
    shifted = scores.sub_(shift[..., None]) if bias is not None else scores - shift[..., None]
    if causal and bias is None:
        shifted[..., first:].masked_fill_(future, float("-inf"))
    return shifted, shift


def _chunks_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool,
                    p: float, scale: float, chunk: int, seed: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with dropout on the probabilities, `chunk` query rows at a time: (out (B, Hq, S,
    D) contiguous, log-sum-exp (B, Hq, S)). The probabilities of a chunk exist only while it runs,
    unnormalised (the output is divided by their sum and 1 - p instead); backward
    (`_chunks_backward`) forms them again from q, k and the log-sum-exp, and the dropout masks from
    `seed`. A causal chunk computes only the keys its queries may see."""
    groups = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    out = q.new_empty(q.shape)  # contiguous, as the fake form says, whatever q's strides
    lse = torch.empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)
    ke_acc = ke.to(lse.dtype)
    for start in range(0, q.shape[2], chunk):
        rows = slice(start, start + chunk)
        shifted, shift = _shifted_scores(q[:, :, rows].to(lse.dtype) * scale, ke_acc, start, bias, causal, q.shape[2])
        probs = shifted.exp_()
        total = probs.sum(-1)  # >= 1 (the largest score's exp) unless the row sees no key
        lse[:, :, rows] = (shift + total.log()).nan_to_num_(neginf=0.0)
        if p:
            drop = _rows_dropped((*probs.shape[:-1], k.shape[2]), p, seed, start, probs.shape[-1], q.device)
            probs.masked_fill_(drop, 0.0)
        norm = total.clamp_min_(1.0).mul_(1.0 - p).reciprocal_()
        out[:, :, rows] = (probs.to(v.dtype) @ ve[:, :, : probs.shape[-1]]) * norm[..., None]
    return out, lse


@torch.library.custom_op("zoo::chunked_attention", mutates_args=())
def _chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool,
                       p: float, scale: float, chunk: int, seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_chunks_forward` as one operator to torch.compile, so that a compiled graph keeps what it
    keeps (not every chunk's probabilities)."""
    return _chunks_forward(q, k, v, bias, causal, p, scale, chunk, seed)


@_chunked_attention.register_fake
def _(q, k, v, bias, causal, p, scale, chunk, seed):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32))


def _chunks_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     bias: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, seed: int | torch.Tensor,
                     causal: bool, p: float, scale: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `_chunks_forward`'s output for q, k, v (contiguous). The factors 1 / (1 - p)
    and `scale` are applied to the (rows, D) operands, not to the chunk's probabilities."""
    groups = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    grad_out = grad_out.to(q.dtype)
    acc = lse.dtype
    delta = (grad_out.to(acc) * out.to(acc)).sum(-1)
    grad_q = q.new_empty(q.shape)
    grad_k = torch.zeros(ke.shape, dtype=acc, device=q.device)
    grad_v = torch.zeros(ve.shape, dtype=acc, device=q.device)
    ke_acc = ke.to(acc)
    for start in range(0, q.shape[2], chunk):
        rows = slice(start, start + chunk)
        q_scaled = q[:, :, rows].to(acc) * scale
        g_kept = grad_out[:, :, rows] * (1.0 / (1.0 - p)) if p else grad_out[:, :, rows]
        probs = _shifted_scores(q_scaled, ke_acc, start, bias, causal, q.shape[2], lse[:, :, rows])[0].exp_()
        keys = slice(0, probs.shape[-1])
        grad_probs = (g_kept @ ve[:, :, keys].transpose(-1, -2)).to(acc)
        dropped = probs
        if p:
            drop = _rows_dropped((*probs.shape[:-1], k.shape[2]), p, seed, start, probs.shape[-1], q.device)
            dropped = probs.masked_fill(drop, 0.0)
            grad_probs.masked_fill_(drop, 0.0)
        grad_v[:, :, keys] += dropped.transpose(-1, -2) @ g_kept.to(acc)
        grad_scores = probs.mul_(grad_probs.sub_(delta[:, :, rows, None]))
        grad_q[:, :, rows] = (grad_scores.to(q.dtype) @ ke[:, :, keys]) * scale
        grad_k[:, :, keys] += grad_scores.transpose(-1, -2) @ q_scaled
    fold = lambda g: g.unflatten(1, (k.shape[1], groups)).sum(2).to(k.dtype).contiguous()  # noqa: E731
    return grad_q, fold(grad_k), fold(grad_v)


@torch.library.custom_op("zoo::chunked_attention_backward", mutates_args=())
def _chunked_attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                bias: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, seed: torch.Tensor,
                                causal: bool, p: float, scale: float,
                                chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _chunks_backward(grad_out, q, k, v, bias, out, lse, seed, causal, p, scale, chunk)


@_chunked_attention_backward.register_fake
def _(grad_out, q, k, v, bias, out, lse, seed, causal, p, scale, chunk):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _keep_for_backward(ctx, inputs, output) -> None:
    q, k, v, bias, causal, p, scale, chunk, seed = inputs
    ctx.save_for_backward(q, k, v, bias, output[0], output[1], seed)
    ctx.config = (causal, p, scale, chunk)


def _backward(ctx, grad_out, _grad_lse):
    return (*_chunked_attention_backward(grad_out, *ctx.saved_tensors, *ctx.config), None, None, None, None, None, None)


_chunked_attention.register_autograd(_backward, setup_context=_keep_for_backward)


class _ChunkedAttention(torch.autograd.Function):
    """`_chunks_forward` and its backward in eager runs: their operators stay in sight of dispatch
    modes (the memory estimator's fake trace counts the chunks' transient bytes, the FLOP count
    their products), which see a custom operator as one call."""

    @staticmethod
    def forward(ctx, q, k, v, bias, causal, p, scale, chunk, seed):
        out, lse = _chunks_forward(q, k, v, bias, causal, p, scale, chunk, seed)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.config = (seed, causal, p, scale, chunk)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return (*_chunks_backward(grad_out, *ctx.saved_tensors, *ctx.config), None, None, None, None, None, None)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None,
           attn_mask: torch.Tensor | None) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share batch and head dimension")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not q.is_floating_point() or q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if key_padding_mask is not None:
        if key_padding_mask.shape != (k.shape[0], k.shape[2]):
            raise ValueError(f"key_padding_mask must be (B, Skv) = {(k.shape[0], k.shape[2])}; "
                             f"got {tuple(key_padding_mask.shape)}")
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(f"key_padding_mask must be bool (True = attend); got {key_padding_mask.dtype}")
    if attn_mask is not None and (attn_mask.shape[-2:] != (q.shape[2], k.shape[2]) or attn_mask.ndim not in (2, 3)
                                  or attn_mask.shape[:-2] not in ((), (q.shape[0],)) or attn_mask.dtype != torch.bool):
        raise ValueError(f"attn_mask must be bool (Sq, Skv) or (B, Sq, Skv) with B, Sq, Skv = "
                         f"{(q.shape[0], q.shape[2], k.shape[2])}; got {attn_mask.dtype} {tuple(attn_mask.shape)}")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              key_padding_mask: torch.Tensor | None = None, dropout_p: float = 0.0, scale: float | None = None,
              training: bool = True, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + masks) v with dropout on the probabilities.

    q: (B, Hq, S, D); k, v: (B, Hkv, Skv, D) with Hq a multiple of Hkv (MQA: Hkv = 1, GQA: 1 < Hkv <
    Hq; query head h uses key/value head h // (Hq / Hkv)); key_padding_mask: (B, Skv) bool, True
    where a key may be attended; attn_mask: (Sq, Skv) or (B, Sq, Skv) bool, True where query i may
    attend key j (the same for every head, e.g. chunk-wise attention); causal masks key j > query i + Skv - S (the queries are the last S
    of the Skv positions, as in incremental decoding; for S = Skv this is SDPA's is_causal).
    scale defaults to 1 / sqrt(D). Returns (B, Hq, S, D). A query that sees no key gets zeros on the
    chunked path."""
    _check(q, k, v, key_padding_mask, attn_mask)
    if causal and k.shape[2] < q.shape[2]:
        raise ValueError(f"causal attention needs at least as many keys as queries; got {k.shape[2]} keys, {q.shape[2]} queries")
    check_probability("dropout_p", dropout_p)
    p = dropout_p if training else 0.0
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]  # (B | 1, 1, Sq | 1, Skv)
    if attn_mask is not None:
        rows = attn_mask[:, None] if attn_mask.ndim == 3 else attn_mask[None, None]
        mask = rows if mask is None else mask & rows
    if p and not q.is_cuda:
        bias = None
        if mask is not None:
            bias = torch.zeros(mask.shape, dtype=torch.float32, device=q.device).masked_fill_(~mask, float("-inf"))
        chunk = rows_per_chunk(4 * q.shape[0] * q.shape[1] * k.shape[2])  # float32 scores of one query row
        if causal:
            chunk = min(chunk, max(CAUSAL_CHUNK_FLOOR, -(-q.shape[2] // CAUSAL_CHUNKS)))
        if torch.compiler.is_compiling():
            return _chunked_attention(q, k, v, bias, causal, p, scale, chunk, draw_seed(p))[0]
        return _ChunkedAttention.apply(q, k, v, bias, causal, p, scale, chunk, draw_seed(p))
    if causal and (mask is not None or q.shape[2] != k.shape[2]):  # else SDPA's is_causal serves
        lower = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(k.shape[2] - q.shape[2])
        mask = lower if mask is None else mask & lower
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal and mask is None,
                                          scale=scale, enable_gqa=q.shape[1] != k.shape[1])


class SelfAttention(nn.Module):
    """Multi-head self-attention: query, key and value projections, `attention()`, and the output
    projection. `kv_heads` < `heads` gives grouped-query attention (kv_heads = 1: multi-query);
    `qk_norm` RMS-normalises the query and key projections (norm epsilon `eps`). State-dict names:
    q.*, k.*, v.*, out.*, q_norm.*, k_norm.* (a checkpoint with one fused qkv.* loads too).

    The head counts of a call are read from the projections' output widths (`head_dim` columns a
    head), so the layer also runs on a tensor-parallel shard that holds some of the heads."""

    def __init__(self, width: int, heads: int, kv_heads: int | None = None, *, bias: bool = True,
                 causal: bool = False, dropout: float = 0.0, recompute: bool = False, qk_norm: bool = False,
                 eps: float = 1e-5) -> None:
        super().__init__()
        kv_heads = heads if kv_heads is None else kv_heads
        if heads < 1 or width % heads:
            raise ValueError(f"heads ({heads}) must divide width ({width})")
        if kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads})")
        check_probability("dropout", dropout)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.causal, self.dropout, self.recompute = causal, dropout, recompute
        self.q = nn.Linear(width, heads * self.head_dim, bias=bias)
        self.k = nn.Linear(width, kv_heads * self.head_dim, bias=bias)
        self.v = nn.Linear(width, kv_heads * self.head_dim, bias=bias)
        self.out = nn.Linear(width, width, bias=bias)
        self.q_norm = Norm(heads * self.head_dim, "rms", eps, bias=False) if qk_norm else None
        self.k_norm = Norm(kv_heads * self.head_dim, "rms", eps, bias=False) if qk_norm else None
        self.register_load_state_dict_pre_hook(self._split_fused_qkv)

    def _split_fused_qkv(self, _module, state_dict, prefix, *args) -> None:
        """Checkpoints written before the projections were split hold qkv.* with rows [q | k | v]."""
        for kind in ("weight", "bias"):
            fused = state_dict.pop(f"{prefix}qkv.{kind}", None)
            if fused is not None:
                sizes = (self.q.out_features, self.k.out_features, self.v.out_features)
                for name, piece in zip("qkv", fused.split(sizes)):
                    state_dict[f"{prefix}{name}.{kind}"] = piece

    def project(self, x: torch.Tensor, rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, S, W) -> q (B, Hq, R, D), k and v (B, Hkv, S, D), with the head counts those of
        the projections' outputs and R the positions `rows` of x (None: all S); with `q_norm` and
        `k_norm`, each of the query and key projections RMS-normalised over its whole width first
        (OLMoE's QK-norm)."""
        q, k, v = self.q(x if rows is None else x[:, rows]), self.k(x), self.v(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return self._heads(q), self._heads(k), self._heads(v)

    def _heads(self, y: torch.Tensor) -> torch.Tensor:
        return y.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)

    def core(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
             cache: LayerKVCache | None = None,
             rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
             attn_mask: torch.Tensor | None = None, rows: slice | None = None) -> torch.Tensor:
        """Projection and attention without the output projection: (B, S, W) -> (B, R, Hq * D),
        R the positions `rows` of x (None: all S). With `cache`, x holds the positions after the
        cached ones, whose keys and values join the cache; key_padding_mask then covers all (B,
        cached + S) positions. rotary: (cos, sin) tables (S, D/2) rotating queries and keys
        (`zoo.nn.rotary`). attn_mask: (R, Skv) or (B, R, Skv) bool, True where a query may attend
        a key (`attention`)."""
        q, k, v = self.project(x, rows)
        if rotary is not None:
            cos, sin = rotary
            query_tables = rotary if rows is None else (cos[rows], sin[rows])
            q, k = apply_rotary(q, *query_tables), apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.append(k, v)
        y = attention(q, k, v, causal=self.causal, key_padding_mask=key_padding_mask, dropout_p=self.dropout,
                      training=self.training, attn_mask=attn_mask)
        return y.transpose(1, 2).flatten(2)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                cache: LayerKVCache | None = None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                attn_mask: torch.Tensor | None = None, rows: slice | None = None) -> torch.Tensor:
        """x: (B, S, W); key_padding_mask: (B, S) bool, True for real tokens. Returns (B, R, W): the
        outputs at positions `rows` of x (None: all S), their queries attending every key. A causal
        layer and a cache take no `rows` (their queries are the last positions of the keys).

        With `recompute` (and no cache), the projections and attention run again in backward
        instead of keeping q, k, v: only x (which the preceding norm keeps anyway) is saved."""
        if rows is not None and (self.causal or cache is not None):
            raise ValueError(f"SelfAttention rows={rows} needs a non-causal layer without a cache; "
                             f"got causal={self.causal}, cache={'given' if cache is not None else None}")
        if self.recompute and torch.is_grad_enabled() and cache is None:
            y = checkpoint(self.core, x, key_padding_mask, None, rotary, attn_mask, rows, use_reentrant=False)
        else:
            y = self.core(x, key_padding_mask, cache, rotary, attn_mask, rows)
        return self.out(y)

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, kv_heads={self.kv_heads}, causal={self.causal}, dropout={self.dropout}, "
                f"recompute={self.recompute}")
