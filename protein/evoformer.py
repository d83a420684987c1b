"""The Evoformer (Jumper et al., 2021, Algorithms 6-15): MSA and pair representations updating each other.

    msa (B, S, L, Cm), pair (B, L, L, Cz), msa_mask (B, S, L), pair_mask (B, L, L)
    block: msa += RowAttention(msa, bias from pair)   (dropout shared along S)
           msa += ColumnAttention(msa);  msa += Transition(msa)
           pair += OuterProductMean(msa)
           pair += TriangleMultiplication outgoing (shared along i), incoming (shared along j)
           pair += TriangleAttention starting node (shared along i), ending node (shared along j)
           pair += Transition(pair)

Every sub-module runs through `protein.chunking.chunked` along a dimension its positions are
independent in; `chunk_size` (None: whole) bounds the intermediate tensors, and with a chunk size
the LayerNorms run inside the chunks (`per_chunk`), so no normalised pair is kept for backward.
Residual updates are added out of place when a gradient is needed, and in place into msa and
pair otherwise (inference, the no-grad recycles): under no_grad the inputs are consumed.

Dynamic axial parallelism (FastFold): under a trainer's tensor parallelism the MSA arrives split by
rows and the pair by its first residue; the `zoo.axial` annotations mark the few places that need
another layout (identities on one device): the pair biases gathered whole, column attention and
the ending-node triangle attention on the transposed split (all-to-all), the outer product mean on
MSA columns with b gathered, the triangle multiplications' b (and the incoming one's a) gathered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from protein.attention import GatedAttention
from protein.chunking import chunked, per_chunk
from protein.precision import LayerNorm, float32_einsum
from zoo import axial
from zoo.nn import dropout


@dataclass(frozen=True)
class EvoformerConfig:
    """Widths and regularisation of the Evoformer."""

    msa_dim: int = 32
    """Cm: width of the MSA representation."""
    pair_dim: int = 32
    """Cz: width of the pair representation."""
    blocks: int = 4
    """Evoformer blocks."""
    msa_heads: int = 4
    """Heads of MSA row and column attention."""
    pair_heads: int = 4
    """Heads of triangle attention."""
    head_dim: int = 16
    """Width of one attention head."""
    outer_product_dim: int = 16
    """Projection width c of the outer product mean (its output flattens c x c)."""
    triangle_dim: int = 32
    """Hidden width of the triangle multiplications."""
    transition_factor: int = 4
    """Hidden width of the transitions as a multiple of their input width."""
    msa_dropout: float = 0.15
    """Dropout on the MSA row attention update (shared along the MSA rows)."""
    pair_dropout: float = 0.25
    """Dropout on the triangle updates (shared along rows or columns)."""

    def __post_init__(self) -> None:
        for name in ("msa_dim", "pair_dim", "blocks", "msa_heads", "pair_heads", "head_dim", "outer_product_dim",
                     "triangle_dim", "transition_factor"):
            if getattr(self, name) < 1:
                raise ValueError(f"EvoformerConfig.{name} must be >= 1; got {getattr(self, name)}")
        for name in ("msa_dropout", "pair_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"EvoformerConfig.{name} must be in [0, 1); got {getattr(self, name)}")


def residual_add(x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """x + update; in place when no gradient is being recorded (saves one tensor of x's size)."""
    if torch.is_grad_enabled():
        return x + update
    return x.add_(update.to(x.dtype))


def pair_dropout(update: torch.Tensor, p: float, training: bool, shared: int) -> torch.Tensor:
    """Dropout of a pair update (B, L, L, C) with one mask value shared along dim `shared` (1: rows,
    2: columns). A mask shared along columns varies along the rows, which axial parallelism splits:
    it is drawn whole (B, L, 1, C) and each rank keeps its rows, so the ranks drop what one device
    would (a mask drawn per rank would repeat rank 0's on every rank)."""
    if not training or p == 0 or shared == 1:
        return dropout(update, p, training, shared_dims=(shared,))
    whole = axial.gather(update.new_ones(update.shape[0], update.shape[1], 1, update.shape[3]), 1)
    return update * axial.own_part(dropout(whole, p, training), 1)


class Transition(nn.Module):
    """LayerNorm -> Linear (n x) -> ReLU -> Linear, on (..., C); chunked along dim 1."""

    def __init__(self, dim: int, factor: int) -> None:
        super().__init__()
        self.norm = LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, factor * dim), nn.Linear(factor * dim, dim)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))

    def forward(self, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
        return chunked(self._run, (x,), 1, chunk_size)


class MSARowAttention(nn.Module):
    """Attention along residues within each MSA row, biased by the pair representation (Algorithm 7)."""

    def __init__(self, config: EvoformerConfig) -> None:
        super().__init__()
        self.norm, self.pair_norm = LayerNorm(config.msa_dim), LayerNorm(config.pair_dim)
        self.pair_bias = nn.Linear(config.pair_dim, config.msa_heads, bias=False)
        self.attention = GatedAttention(config.msa_dim, config.msa_heads, config.head_dim)

    def forward(self, msa, pair, msa_mask, chunk_size=None):
        source, norm = per_chunk(self.pair_norm, pair, chunk_size)
        bias = chunked(lambda rows: self.pair_bias(norm(rows)), (source,), 1, chunk_size)
        # Made contiguous once (it is (B, H, L, L)): SDPA's flash kernel would copy a strided bias, per row.
        bias = axial.gather(bias, 1).permute(0, 3, 1, 2).contiguous()[:, None]  # (B, 1, H, L, L)
        return chunked(lambda m, mask, pair_bias: self.attention(self.norm(m), pair_bias, mask),
                       (msa, msa_mask), 1, chunk_size, whole=(bias,))


class MSAColumnAttention(nn.Module):
    """Attention along the MSA rows within each residue column (Algorithm 8)."""

    def __init__(self, config: EvoformerConfig) -> None:
        super().__init__()
        self.norm = LayerNorm(config.msa_dim)
        self.attention = GatedAttention(config.msa_dim, config.msa_heads, config.head_dim)

    def forward(self, msa, msa_mask, chunk_size=None):
        columns, mask = (axial.reshard(t.transpose(1, 2), 2, 1) for t in (msa, msa_mask))  # (B, L, S, Cm)
        update = chunked(lambda m, k: self.attention(self.norm(m), key_mask=k), (columns, mask), 1, chunk_size)
        return axial.reshard(update, 1, 2).transpose(1, 2)


class OuterProductMean(nn.Module):
    """pair_ij += Linear(mean_s a_si ⊗ b_sj) over the present MSA rows (Algorithm 10); the sum over s
    in float32; chunked along i."""

    def __init__(self, config: EvoformerConfig) -> None:
        super().__init__()
        c = config.outer_product_dim
        self.norm = LayerNorm(config.msa_dim)
        self.a, self.b = nn.Linear(config.msa_dim, c), nn.Linear(config.msa_dim, c)
        self.out = nn.Linear(c * c, config.pair_dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, msa, msa_mask, chunk_size=None):
        m = axial.reshard(self.norm(msa), 1, 2)  # split by residues i (columns), all MSA rows
        columns_mask = axial.reshard(msa_mask, 1, 2)
        mask = columns_mask[..., None].to(m.dtype)
        a, b = self.a(m) * mask, axial.gather(self.b(m) * mask, 2)  # (B, S, L, c)
        count = float32_einsum("bsi,bsj->bij", columns_mask.float(), axial.gather(columns_mask, 2).float())[..., None]

        def product(a_rows: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            outer = float32_einsum("bsic,bsjd->bijcd", a_rows, b).flatten(-2)  # (B, i, L, c*c)
            return self.out(outer.to(b.dtype))

        return chunked(product, (a,), 2, chunk_size, out_dim=1, whole=(b,)) / (count + 1e-3)


class TriangleMultiplication(nn.Module):
    """pair_ij += g_ij ⊙ Linear(LN(Σ_k a_ik ⊙ b_jk)) ("outgoing") or Σ_k a_ki ⊙ b_kj ("incoming")
    (Algorithms 11, 12); the sum over k in float32. Chunked over the hidden channels (a chunk
    normalises the pair, projects, gates and multiplies only its own channels of a and b), then
    the gated output along i."""

    def __init__(self, config: EvoformerConfig, outgoing: bool) -> None:
        super().__init__()
        dim, hidden = config.pair_dim, config.triangle_dim
        self.outgoing = outgoing
        self.norm, self.out_norm = LayerNorm(dim), LayerNorm(hidden)
        self.projection, self.projection_gate = nn.Linear(dim, 2 * hidden), nn.Linear(dim, 2 * hidden)
        self.gate, self.out = nn.Linear(dim, dim), nn.Linear(hidden, dim)
        for layer in (self.gate, self.out):
            nn.init.zeros_(layer.weight)
        nn.init.ones_(self.gate.bias)
        nn.init.zeros_(self.out.bias)

    def forward(self, pair, pair_mask, chunk_size=None):
        source, norm = per_chunk(self.norm, pair, chunk_size)
        equation = "bikc,bjkc->bijc" if self.outgoing else "bkic,bkjc->bijc"

        def edges(*parts):  # the chunk's channels (c, 2, ...) of the projections and gates, then source, pair_mask
            *weights, source, pair_mask = parts
            weight, bias, gate_weight, gate_bias = (t.transpose(0, 1).flatten(0, 1) for t in weights)  # a's, then b's
            z = norm(source)
            gated = F.linear(z, weight, bias) * torch.sigmoid(F.linear(z, gate_weight, gate_bias))
            a, b = (gated * pair_mask[..., None].to(gated.dtype)).chunk(2, dim=-1)
            b = axial.gather(b, 1)  # every j: b_jk (outgoing), b_kj over every k (incoming)
            if not self.outgoing:  # a_ki over every k, for this rank's i
                a = axial.own_part(axial.gather(a, 1), 2)
            return float32_einsum(equation, a, b)

        hidden = self.out_norm.normalized_shape[0]
        by_channel = [t.unflatten(0, (2, hidden)).transpose(0, 1) for t in  # (hidden, 2, ...): channel c of a and of b
                      (self.projection.weight, self.projection.bias, self.projection_gate.weight, self.projection_gate.bias)]
        combined = chunked(edges, tuple(by_channel), 0, chunk_size, out_dim=3, whole=(source, pair_mask))  # (B, L, L, c)
        return chunked(lambda rows, products: torch.sigmoid(self.gate(norm(rows))) * self.out(self.out_norm(products)),
                       (source, combined), 1, chunk_size)


class TriangleAttention(nn.Module):
    """Starting node: pair_ij attends over pair_ik with bias b_jk (Algorithm 13); ending node: the
    same on the transposed pair (Algorithm 14). Chunked along i."""

    def __init__(self, config: EvoformerConfig, starting: bool) -> None:
        super().__init__()
        self.starting = starting
        self.norm = LayerNorm(config.pair_dim)
        self.bias = nn.Linear(config.pair_dim, config.pair_heads, bias=False)
        self.attention = GatedAttention(config.pair_dim, config.pair_heads, config.head_dim)

    def forward(self, pair, pair_mask, chunk_size=None):
        if not self.starting:
            pair, pair_mask = (axial.reshard(t.transpose(1, 2), 2, 1) for t in (pair, pair_mask))
        source, norm = per_chunk(self.norm, pair, chunk_size)
        triangle_bias = chunked(lambda rows: self.bias(norm(rows)), (source,), 1, chunk_size)
        # (B, 1, H, L, L): b_jk for every i, contiguous as in MSARowAttention
        triangle_bias = axial.gather(triangle_bias, 1).permute(0, 3, 1, 2).contiguous()[:, None]
        update = chunked(lambda rows, mask, bias: self.attention(norm(rows), bias, mask),
                         (source, pair_mask), 1, chunk_size, whole=(triangle_bias,))
        return update if self.starting else axial.reshard(update, 1, 2).transpose(1, 2)


class EvoformerBlock(nn.Module):
    """forward(msa, pair, msa_mask, pair_mask, chunk_size=None) -> (msa, pair): one block (Algorithm 6)."""

    def __init__(self, config: EvoformerConfig) -> None:
        super().__init__()
        self.config = config
        self.row_attention = MSARowAttention(config)
        self.column_attention = MSAColumnAttention(config)
        self.msa_transition = Transition(config.msa_dim, config.transition_factor)
        self.outer_product_mean = OuterProductMean(config)
        self.triangle_out = TriangleMultiplication(config, outgoing=True)
        self.triangle_in = TriangleMultiplication(config, outgoing=False)
        self.triangle_start = TriangleAttention(config, starting=True)
        self.triangle_end = TriangleAttention(config, starting=False)
        self.pair_transition = Transition(config.pair_dim, config.transition_factor)

    def forward(self, msa, pair, msa_mask, pair_mask, chunk_size: int | None = None):
        p_msa, p_pair, training = self.config.msa_dropout, self.config.pair_dropout, self.training
        msa = residual_add(msa, dropout(self.row_attention(msa, pair, msa_mask, chunk_size), p_msa, training,
                                        shared_dims=(1,)))
        msa = residual_add(msa, self.column_attention(msa, msa_mask, chunk_size))
        msa = residual_add(msa, self.msa_transition(msa, chunk_size))
        pair = residual_add(pair, self.outer_product_mean(msa, msa_mask, chunk_size))
        for update, shared in ((self.triangle_out, 1), (self.triangle_in, 2), (self.triangle_start, 1),
                               (self.triangle_end, 2)):
            pair = residual_add(pair, pair_dropout(update(pair, pair_mask, chunk_size), p_pair, training, shared))
        pair = residual_add(pair, self.pair_transition(pair, chunk_size))
        return msa, pair


class Evoformer(nn.Module):
    """forward(msa, pair, msa_mask, pair_mask, chunk_size=None) -> (msa, pair) after all blocks."""

    def __init__(self, config: EvoformerConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(EvoformerBlock(config) for _ in range(config.blocks))

    def forward(self, msa, pair, msa_mask, pair_mask, chunk_size: int | None = None):
        for block in self.blocks:
            msa, pair = block(msa, pair, msa_mask, pair_mask, chunk_size)
        return msa, pair
