"""A mixture-of-experts feed-forward (`MoEFeedForward`): a router sends each token to its top-k
experts, each a gated feed-forward down(silu(gate(x)) * up(x)) as in Mixtral, Qwen-MoE, OLMoE and
DeepSeek-MoE, and sums their outputs weighted by the router; shared experts, when configured, see
every token (DeepSeek-MoE).

Dispatch is dropless: the (token, expert) assignments are sorted by expert and each expert
multiplies its contiguous run of tokens, however many (no capacity factor, no token dropped). The
experts' weights are stacked in one module (`RoutedExperts`), (E, F, W) for gate and up and
(E, W, F) for down, so an expert no token chose still gets a (zero) gradient, the same on every
rank, and expert parallelism shards them along E (`zoo.plan.ModelPlan.experts`). The routed experts keep for
backward only each assignment's gate pre-activation (F values), as the dense fused feed-forward
keeps its pre-activation (`_experts_forward`; one custom operator under torch.compile). Each product over the experts is one grouped product
(torch's, where it takes the shapes: rows 16-byte aligned), else one product an expert, said once
in the log; the runs' lengths are read on the host (one synchronisation a layer on a GPU). A trace
without values (the memory estimator's fake tensors) takes the load as even over the experts.

Routers: "softmax" (Mixtral, Switch: softmax over the experts' logits, then the top k) and
"sigmoid" (DeepSeek-V3: independent sigmoid scores, then the top k); `normalize_top_k` rescales
a token's k weights to sum to 1. Beside the output the layer returns its auxiliary loss: Switch's
load-balancing loss E * sum_e f_e * P_e (f_e: expert e's share of the k * N assignments; P_e: its
mean score over the N tokens, scores normalised to sum to 1 per token) times `balance_weight`,
plus the router z-loss of ST-MoE, mean over tokens of logsumexp(logits)^2, times `z_weight`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.torch_compat import FakeTensor, grouped_mm

log = logging.getLogger("zoo.nn")
Router = Literal["softmax", "sigmoid"]


@dataclass(frozen=True)
class MoEConfig:
    """Shape and routing of a `MoEFeedForward`."""

    width: int
    """Model width W: the tokens' features in and out."""
    hidden: int
    """Hidden width F of each expert (and of each shared expert)."""
    experts: int
    """Routed experts E."""
    top_k: int = 2
    """Experts each token is sent to (1 <= top_k <= experts)."""
    shared_experts: int = 0
    """Experts every token goes through besides its routed ones (one gated feed-forward of
    shared_experts x hidden width)."""
    router: Router = "softmax"
    """How the router scores the experts: "softmax" over their logits or "sigmoid" of each."""
    normalize_top_k: bool = True
    """Rescale a token's top-k weights to sum to 1 (Mixtral: yes; OLMoE: no)."""
    balance_weight: float = 0.01
    """Weight of Switch's load-balancing loss in the auxiliary loss."""
    z_weight: float = 0.0
    """Weight of the router z-loss (ST-MoE) in the auxiliary loss."""

    def __post_init__(self) -> None:
        for name in ("width", "hidden", "experts"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be >= 1; got {getattr(self, name)}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"MoEConfig.top_k must be between 1 and experts={self.experts}; got {self.top_k}")
        if self.shared_experts < 0:
            raise ValueError(f"MoEConfig.shared_experts must be >= 0; got {self.shared_experts}")
        if self.router not in ("softmax", "sigmoid"):
            raise ValueError(f"MoEConfig.router must be 'softmax' or 'sigmoid'; got {self.router!r}")
        for name in ("balance_weight", "z_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"MoEConfig.{name} must be >= 0; got {getattr(self, name)}")


Runs = tuple[list[int], torch.Tensor]
"""The assignments a run each expert has, as a list and as their running sums (int32, the grouped
product's offsets), made once a call."""


def _runs(counts: list[int], device: torch.device) -> Runs:
    return counts, torch.tensor(counts, device=device).cumsum(0).to(torch.int32)


def _per_expert(rows: torch.Tensor, matrices: torch.Tensor, runs: Runs) -> torch.Tensor:
    """Each expert's run of `rows` (A, K), sorted by expert, times its matrix of `matrices`
    (E, K, M) -> (A, M): one grouped product where torch has one for these shapes, else one product
    an expert."""
    counts = runs[0]
    grouped = _grouped(rows, matrices, runs)
    if grouped is not None:
        return grouped
    return torch.cat([run @ matrices[e] for e, run in enumerate(rows.split(counts))])


def _per_expert_outer(left: torch.Tensor, right: torch.Tensor, runs: Runs) -> torch.Tensor:
    """Each expert's sum over its run of the outer products left^T right: left (A, P), right (A, Q),
    sorted by expert -> (E, P, Q) (the experts' weight gradients)."""
    counts = runs[0]
    grouped = _grouped(left.t(), right, runs)
    if grouped is not None:
        return grouped
    return torch.stack([a.t() @ b for a, b in zip(left.split(counts), right.split(counts))])


def _grouped(a: torch.Tensor, b: torch.Tensor, runs: Runs) -> torch.Tensor | None:
    """torch's grouped product over the expert runs (a's rows, or its columns when b is 2-D), or
    None where it does not take operands of this kind (then the caller loops). Whether it takes
    them is decided once per kind (`_grouped_kind`) and said once; any error other than the
    kernel's refusal of the operands (out of memory included) is raised."""
    if grouped_mm is None:
        return None
    if isinstance(a, FakeTensor):  # a trace without values: the product's output, as a real run allocates it
        rows = (a.shape[0], b.shape[-1]) if b.ndim == 3 else (len(runs[0]), a.shape[0], b.shape[-1])
        return a.new_empty(rows)
    kind = _grouped_kind(a, b)
    if kind in _grouped_refused:
        return None
    try:
        return grouped_mm(a, b, offs=runs[1])
    except RuntimeError as error:
        message = str(error).splitlines()[0]
        if isinstance(error, torch.OutOfMemoryError) or not any(words in message for words in GROUPED_REFUSALS):
            raise
        _grouped_refused.add(kind)
        log.warning(f"zoo.nn.moe: torch's grouped product refused {tuple(a.shape)} x {tuple(b.shape)} {a.dtype} on "
                    f"{a.device} ({message}); the experts run one product each for operands of this kind")
        return None


GROUPED_REFUSALS = ("Expected mat_", "strides should be", "multiple of 16", "Offsets have to be", "only supported",
                    "not supported", "not implemented for")
"""Words of torch's refusals of a grouped product's operands (dtype, alignment, device): the errors
that turn the experts to one product each; any other error is raised."""
_grouped_refused: set[tuple] = set()
"""The kinds of operands the grouped product refused in this process (`_grouped_kind`)."""


def _grouped_kind(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """What the grouped product's support depends on: device, dtypes, ranks, and whether each
    stride is a multiple of 16 bytes."""
    aligned = lambda t: tuple(stride * t.element_size() % 16 == 0 for stride in t.stride())  # noqa: E731
    return a.device.type, a.dtype, b.dtype, a.ndim, b.ndim, aligned(a), aligned(b)


def _experts_forward(tokens: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                     down: torch.Tensor, token_of: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """sum over a token's assignments of weight * down_e(silu(gate_e(x)) * up_e(x)): tokens (N, W);
    weights (A,) and token_of (A,) of the A = N * k assignments sorted by expert, `counts` of them
    per expert; gate, up (E, F, W), down (E, W, F) -> ((N, W), each assignment's gate
    pre-activation (A, F)). Its backward (`_experts_backward`) needs only the pre-activation beside
    the inputs: up's output, the hidden activation and the experts' outputs are computed again
    (two more products a routed token), as the dense fused feed-forward keeps only its
    pre-activation."""
    routed, runs = tokens[token_of], _runs(counts, tokens.device)
    gated = _per_expert(routed, gate.transpose(1, 2), runs)
    hidden = F.silu(gated) * _per_expert(routed, up.transpose(1, 2), runs)
    outputs = _per_expert(hidden, down.transpose(1, 2), runs)
    return torch.zeros_like(tokens).index_add_(0, token_of, outputs * weights[:, None]), gated


@torch.library.custom_op("zoo::routed_experts", mutates_args=())
def _routed_experts(tokens: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                    down: torch.Tensor, token_of: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_experts_forward` as one operator to torch.compile (its fake form gives the shapes), with
    `counts` a tensor read on the host inside it, not in the compiled graph."""
    return _experts_forward(tokens, weights, gate, up, down, token_of, counts.tolist())


@_routed_experts.register_fake
def _(tokens, weights, gate, up, down, token_of, counts):
    return torch.empty_like(tokens), tokens.new_empty(token_of.shape[0], gate.shape[1])


def _experts_backward(grad: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor,
                      up: torch.Tensor, down: torch.Tensor, token_of: torch.Tensor, counts: list[int],
                      gated: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Gradients of `_experts_forward`'s output `grad` (N, W) for tokens, weights, gate, up, down."""
    runs = _runs(counts, tokens.device)
    routed, grad_routed = tokens[token_of], grad[token_of]
    u = _per_expert(routed, up.transpose(1, 2), runs)
    sigmoid = torch.sigmoid(gated)
    s = gated * sigmoid
    hidden = s * u
    grad_weights = (grad_routed * _per_expert(hidden, down.transpose(1, 2), runs)).sum(-1)
    grad_out = grad_routed * weights[:, None]
    grad_hidden = _per_expert(grad_out, down, runs)
    grad_u = grad_hidden * s
    grad_g = grad_hidden * u * sigmoid * (1 + gated * (1 - sigmoid))
    grad_in = _per_expert(grad_g, gate, runs) + _per_expert(grad_u, up, runs)
    return (torch.zeros_like(tokens).index_add_(0, token_of, grad_in), grad_weights,
            _per_expert_outer(grad_g, routed, runs), _per_expert_outer(grad_u, routed, runs),
            _per_expert_outer(grad_out, hidden, runs))


@torch.library.custom_op("zoo::routed_experts_backward", mutates_args=())
def _routed_experts_backward(grad: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor, gate: torch.Tensor,
                             up: torch.Tensor, down: torch.Tensor, token_of: torch.Tensor, counts: torch.Tensor,
                             gated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                           torch.Tensor]:
    return _experts_backward(grad, tokens, weights, gate, up, down, token_of, counts.tolist(), gated)


@_routed_experts_backward.register_fake
def _(grad, tokens, weights, gate, up, down, token_of, counts, gated):
    return tuple(torch.empty_like(t) for t in (tokens, weights, gate, up, down))


def _keep_for_backward(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs, output[1])


def _backward(ctx, grad, _grad_gated):
    return (*_routed_experts_backward(grad, *ctx.saved_tensors), None, None)


_routed_experts.register_autograd(_backward, setup_context=_keep_for_backward)


class _RoutedExperts(torch.autograd.Function):
    """`_experts_forward` and its backward in eager runs, their operators in sight of dispatch
    modes (the memory estimator's fake trace, the FLOP count), which see a custom operator as one
    call; the runs' lengths read on the host once, in forward."""

    @staticmethod
    def forward(ctx, tokens, weights, gate, up, down, token_of, counts):
        counts = counts.tolist()
        out, gated = _experts_forward(tokens, weights, gate, up, down, token_of, counts)
        ctx.save_for_backward(tokens, weights, gate, up, down, token_of, gated)
        ctx.counts = counts
        return out

    @staticmethod
    def backward(ctx, grad):
        tokens, weights, gate, up, down, token_of, gated = ctx.saved_tensors
        return (*_experts_backward(grad, tokens, weights, gate, up, down, token_of, ctx.counts, gated), None, None)


class GatedFeedForward(nn.Module):
    """down(silu(gate(x)) * up(x)) without biases: x (..., W) -> (..., W)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def even_counts(assignments: int, experts: int, device: torch.device) -> torch.Tensor:
    """`assignments` spread as evenly as they go over `experts` (the first ones one more), int64
    (experts,): the load a trace without values takes, which the load-balancing loss aims at."""
    share, extra = divmod(assignments, experts)
    return torch.tensor([share + (e < extra) for e in range(experts)], dtype=torch.int64, device=device)


def routed_experts(tokens: torch.Tensor, weights: torch.Tensor, token_of: torch.Tensor, counts: torch.Tensor,
                   gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """sum over a token's assignments of weight * down_e(silu(gate_e(x)) * up_e(x)): tokens (N, W);
    weights (A,) and token_of (A,) of the A assignments sorted by expert, counts (E,) int64 of them
    per expert; gate, up (E, F, W), down (E, W, F) -> (N, W) (`_experts_forward`: one custom operator
    under torch.compile, an autograd function in eager)."""
    if torch.compiler.is_compiling():
        return _routed_experts(tokens, weights, gate, up, down, token_of, counts)[0]
    return _RoutedExperts.apply(tokens, weights, gate, up, down, token_of, counts)


class RoutedExperts(nn.Module):
    """E gated feed-forwards of width W and hidden width F, their matrices stacked along dim 0 by
    expert: gate, up (E, F, W), down (E, W, F). forward(tokens (N, W), weights (A,), token_of (A,),
    counts (E,)) -> (N, W): each token's assignments (sorted by expert, `counts` per expert) through
    their experts, weighted and summed (`routed_experts`).

    The contract expert and tensor parallelism build on (`zoo.plan.ModelPlan.experts`): `compute`
    does the same with the stacked matrices given, so that a rank holding experts [e0, e0 + E')
    computes with its slices (E', ...) on the tokens sent to them, counts (E',); and with slices of
    the hidden width (`HIDDEN_DIMS`), its share of the output, which the ranks' shares sum to."""

    HIDDEN_DIMS = {"gate": 1, "up": 1, "down": 2}
    """The dimension of each stacked matrix that runs along the hidden width F."""

    def __init__(self, experts: int, width: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.empty(experts, hidden, width))
        self.up = nn.Parameter(torch.empty(experts, hidden, width))
        self.down = nn.Parameter(torch.empty(experts, width, hidden))
        self.reset_parameters()

    @property
    def experts(self) -> int:
        """Experts E (all of them, whatever a rank holds)."""
        return self.gate.shape[0]

    @property
    def hidden(self) -> int:
        """Hidden width F of each expert (all of it, whatever a rank holds)."""
        return self.gate.shape[self.HIDDEN_DIMS["gate"]]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Each expert's matrices as `nn.Linear` initialises its weight: U(-1/sqrt(fan_in), +)."""
        for weight in (self.gate, self.up, self.down):
            bound = 1 / math.sqrt(weight.shape[-1])
            weight.uniform_(-bound, bound)

    def forward(self, tokens: torch.Tensor, weights: torch.Tensor, token_of: torch.Tensor,
                counts: torch.Tensor) -> torch.Tensor:
        return self.compute(tokens, weights, token_of, counts, gate=self.gate, up=self.up, down=self.down)

    @staticmethod
    def compute(tokens: torch.Tensor, weights: torch.Tensor, token_of: torch.Tensor, counts: torch.Tensor, *,
                gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """`forward` with the stacked matrices given by parameter name (plain tensors)."""
        return routed_experts(tokens, weights, token_of, counts, gate, up, down)


class MoEFeedForward(nn.Module):
    """See the module docstring. forward(x (..., W)) -> (y (..., W), auxiliary loss (scalar,
    float32)); `expert_counts` holds the last call's assignments per expert (E,)."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.router = nn.Linear(config.width, config.experts, bias=False)
        self.experts = RoutedExperts(config.experts, config.width, config.hidden)
        self.shared = (GatedFeedForward(config.width, config.shared_experts * config.hidden)
                       if config.shared_experts else None)
        self.expert_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.config
        if x.shape[-1] != config.width:
            raise ValueError(f"MoEFeedForward expects inputs of width {config.width}; got shape {tuple(x.shape)}")
        tokens = x.reshape(-1, config.width)
        logits = self.router(tokens).float()
        scores = logits.softmax(-1) if config.router == "softmax" else logits.sigmoid()
        weights, chosen = scores.topk(config.top_k, dim=-1)
        if config.normalize_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        assignments = chosen.reshape(-1)
        order = assignments.argsort(stable=True)
        if isinstance(assignments, FakeTensor):  # the memory estimator's trace: no values, the load taken as even
            counts = even_counts(assignments.shape[0], config.experts, x.device)
        else:
            counts = torch.zeros(config.experts, dtype=torch.int64, device=x.device).index_add_(
                0, assignments, torch.ones_like(assignments))
        y = self.experts(tokens, weights.reshape(-1)[order].to(x.dtype), order // config.top_k, counts)
        if self.shared is not None:
            y = y + self.shared(tokens)
        self.expert_counts = counts.detach()
        return y.reshape(x.shape), self._auxiliary_loss(logits, scores, counts)

    def _auxiliary_loss(self, logits: torch.Tensor, scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The weighted load-balancing and z-losses; 0 for no tokens (still on the router's graph)."""
        config = self.config
        if logits.shape[0] == 0:
            return logits.sum()
        loss = logits.new_zeros(())
        if config.balance_weight:
            share = counts.float() / counts.sum()
            mean_score = (scores / scores.sum(-1, keepdim=True)).mean(0)
            loss = loss + config.balance_weight * config.experts * (share * mean_score).sum()
        if config.z_weight:
            loss = loss + config.z_weight * logits.logsumexp(-1).square().mean()
        return loss
