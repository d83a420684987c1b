"""GPT: a pre-norm decoder-only transformer (GPT-2 shaped, or Mixtral's) on the fused `zoo.nn` layers.

    embeddings (word + learned position, dropout) -> blocks (causal `TransformerBlock`s, GELU tanh)
    -> norm -> LM head tied to the word embedding, fused with the cross-entropy

`GPTConfig` also builds Mixtral's variant: rotary positions in every block's attention instead of
the learned table, RMSNorm, no biases, mixture-of-experts feed-forwards and an output head of its own.

Batches follow Hugging Face's causal LMs: `labels` are unshifted (usually `input_ids` itself, -100
ignored) and position t is scored on labels[:, t + 1]; the output holds "loss" and "logits". Training
with labels, or a caller that asks for the loss only (`zoo.nn.logits`), takes the fused path instead
(`skip_logits`, as Liger-Kernel does for HF models): the loss comes from `zoo.nn.linear_cross_entropy`
and the (tokens x vocab) logits are never formed.
`generate` decodes with a `KVCache`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from nlp.gpt.config import GPTConfig
from nlp.sampling import Sampling, next_token
from zoo.nn import Embeddings, KVCache, Norm, TransformerBlock, TransformerBlockConfig, block_plan, linear_cross_entropy
from zoo.nn.moe import MoEConfig, RoutedExperts
from zoo.nn.cross_entropy import IGNORE_INDEX
from zoo.nn.logits import skip_logits as decide_skip_logits
from zoo.nn.rotary import rotary_tables
from zoo.nn.init import init_transformer_
from zoo.plan import Carry, ModelPlan, PipelineSplit
from zoo.registry import register

def block_config(config: GPTConfig, index: int = 0) -> TransformerBlockConfig:
    """The `TransformerBlock` shape of block `index` of a GPT (a mixture of experts for every
    moe_every-th block when the config has experts)."""
    moe = None
    if config.n_experts and (index + 1) % config.moe_every == 0:
        moe = MoEConfig(width=config.n_embd, hidden=config.moe_hidden or 4 * config.n_embd, experts=config.n_experts,
                        top_k=config.moe_top_k, shared_experts=config.n_shared_experts,
                        normalize_top_k=config.moe_normalize_top_k, balance_weight=config.moe_balance_weight)
    return TransformerBlockConfig(
        width=config.n_embd, heads=config.n_head, kv_heads=config.n_kv_head, activation="gelu_tanh", prenorm=True,
        norm=config.norm, causal=True, dropout=config.dropout, attention_dropout=config.dropout, bias=config.bias,
        eps=config.norm_eps, recompute_attention=config.recompute_attention, qk_norm=config.qk_norm, moe=moe)


@register("gpt", GPTConfig)
class GPT(nn.Module):
    """`forward(input_ids, labels=None, skip_logits=None)`: see `forward`. State-dict names:
    embeddings.{word,position}.weight, blocks.N.{norm1,attn.{q,k,v,out},norm2,mlp.fc1,mlp.fc2}.*, norm.*,
    and lm_head.weight when the head is not tied."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        learned = config.block_size if config.positions == "learned" else 0
        self.embeddings = Embeddings(config.vocab_size, config.n_embd, positions=learned, dropout=config.dropout)
        self.blocks = nn.ModuleList(TransformerBlock(block_config(config, index)) for index in range(config.n_layer))
        self.norm = Norm(config.n_embd, config.norm, config.norm_eps, bias=config.bias)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    @staticmethod
    def example_batch(config: GPTConfig, rows: int) -> dict[str, torch.Tensor]:
        """A training micro batch of `rows` full-length sequences (input_ids = labels, (rows,
        block_size)) of random tokens: what `zoo plan` estimates a step with."""
        ids = torch.randint(0, config.vocab_size, (rows, config.block_size))
        return {"input_ids": ids, "labels": ids}

    def parallel_plan(self) -> ModelPlan:
        """Each block is one shard and recompute unit and holds two tensor-parallel regions
        (`block_plan`); the word embedding, and through the tied weight the output head, split by
        vocabulary rows. Under sequence parallelism the embeddings' output is split along the
        sequence and the final norm's output gathered whole for the head. Blocks with experts are
        planned as `block_plan` says (their experts shard under tensor and expert parallelism), and
        their auxiliary losses travel from stage to stage. A GPT with QK-norm splits nothing but
        its experts and runs unpipelined: its blocks are its shard and recompute units."""
        shapes = {index: block_config(self.config, index) for index in range(self.config.n_layer)}
        plans = [block_plan("blocks.*", shape) for shape in {(s.moe is None): s for s in shapes.values()}.values()]
        blocks = plans[0] if len(plans) == 1 else plans[0].merged(plans[1])
        if self.config.qk_norm:
            return blocks
        head = "embeddings.word" if self.config.tie_embeddings else "lm_head"
        return replace(blocks, vocab_parallel=("embeddings.word",), sequence_split=("embeddings",),
                       sequence_parallel=(*blocks.sequence_parallel, "norm"), sequence_gather=("norm",),
                       pipeline=PipelineSplit(pre=("embeddings",), post=("norm", head)))

    def pipeline_enter(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Carry:
        """First pipeline stage: {"hidden": (B, T, C) embeddings of input_ids (B, T)}, with experts
        also {"aux": the auxiliary losses so far, a float32 zero}."""
        hidden = self._embed(input_ids)
        return {"hidden": hidden, "aux": hidden.new_zeros((), dtype=torch.float32)} if self.config.n_experts else {
            "hidden": hidden}

    def pipeline_block(self, block: nn.Module, carry: Carry) -> Carry:
        """One block on {"hidden": (B, T, C)} (and "aux", to which a mixture-of-experts block adds its own)."""
        hidden = carry["hidden"]
        out = {"hidden": block(hidden, rotary=self._rotary(0, hidden.shape[1], hidden.device))}
        if "aux" in carry:
            out["aux"] = carry["aux"] if block.aux_loss is None else carry["aux"] + block.aux_loss
        return out

    def pipeline_exit(self, carry: Carry, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Last pipeline stage: the fused head + loss on the final norm of carry["hidden"] (B, T, C),
        plus the experts' auxiliary losses carry["aux"]."""
        loss = self._fused_loss(self.norm(carry["hidden"]), labels)
        return loss + carry["aux"] if "aux" in carry else loss

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections (experts' down included) scaled by
        1/sqrt(2 n_layer)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        init_transformer_(self, residual_std=residual_std, residual=("attn.out", "mlp.fc2", "shared.down"))
        for module in self.modules():
            if isinstance(module, RoutedExperts):
                module.gate.normal_(0.0, 0.02)
                module.up.normal_(0.0, 0.02)
                module.down.normal_(0.0, residual_std)

    def auxiliary_loss(self) -> torch.Tensor | float:
        """The mixture-of-experts blocks' auxiliary losses of the last forward, summed (0 without
        experts): what training adds to the cross-entropy."""
        return sum((block.aux_loss for block in self.blocks if block.aux_loss is not None), 0.0)

    def num_parameters(self) -> int:
        """Number of parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    @property
    def head_weight(self) -> torch.Tensor:
        """The output head's weight (V, C): the word embedding's when tied, else lm_head's."""
        return self.embeddings.word.weight if self.lm_head is None else self.lm_head.weight

    def new_cache(self, batch: int, max_length: int | None = None) -> KVCache:
        """An empty `KVCache` for `batch` sequences of up to `max_length` (default block_size) positions."""
        config, weight = self.config, self.head_weight
        return KVCache(config.n_layer, batch, config.n_kv_head or config.n_head, config.n_embd // config.n_head,
                       max_length or config.block_size, dtype=weight.dtype, device=weight.device)

    def hidden_states(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """input_ids: (B, T) int64, the positions after those in `cache` (if any). Returns the final
        normalised hidden states (B, T, C); with a cache, its keys and values grow by T."""
        past = 0 if cache is None else cache.length
        x = self._embed(input_ids, past)
        rotary = self._rotary(past, input_ids.shape[1], input_ids.device)
        for index, block in enumerate(self.blocks):
            x = block(x, cache=None if cache is None else cache.layer(index), rotary=rotary)
        if cache is not None:
            cache.advance(input_ids.shape[1])
        return self.norm(x)

    def _embed(self, input_ids: torch.Tensor, past: int = 0) -> torch.Tensor:
        """(B, T, C) embeddings of input_ids (B, T) at positions past..past + T - 1."""
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must have shape (B, T); got {tuple(input_ids.shape)}")
        length = input_ids.shape[1]
        if past + length > self.config.block_size:
            raise ValueError(f"input_ids length must be <= block_size={self.config.block_size}; got {past + length}"
                             + (f" ({past} cached)" if past else ""))
        positions = torch.arange(past, past + length, device=input_ids.device)[None]
        return self.embeddings(input_ids, position_ids=positions)

    def _rotary(self, past: int, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (cos, sin) tables of positions past..past + length - 1 (`zoo.nn.rotary`), each
        (length, head_dim / 2); None with learned positions."""
        if self.config.positions != "rotary":
            return None
        config = self.config
        cos, sin = rotary_tables(past + length, config.n_embd // config.n_head, config.rope_theta, device)
        return cos[past:], sin[past:]

    @staticmethod
    def _targets(labels: torch.Tensor) -> torch.Tensor:
        """(B * T,) targets: position t's is labels[:, t + 1], the last position's none (-100).
        Shifting the labels (as transformers does) keeps hidden states and logits whole: slicing
        them would copy them."""
        return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX).flatten()

    def _fused_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of the tied head on normalised hidden (B, T, C), logits never formed."""
        return linear_cross_entropy(hidden.flatten(0, 1), self.head_weight, self._targets(labels))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                skip_logits: bool | None = None) -> dict[str, torch.Tensor]:
        """input_ids: (B, T) int64 with T <= block_size; labels: (B, T) int64, unshifted as in Hugging
        Face (position t predicts labels[:, t + 1]; -100 ignored).

        Returns {"logits": (B, T, V)}, plus with labels {"loss"}: the mean cross-entropy in fp32 over
        the T - 1 predicted positions (plus the experts' auxiliary loss, `auxiliary_loss`, in a GPT
        with experts). skip_logits: return {"loss"} alone, from the fused linear +
        cross-entropy that never forms the logits; None (default) skips them when there are labels and
        the model trains or runs inside `zoo.nn.logits.loss_only()` (as the trainer's steps do).
        """
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(f"labels must have the shape of input_ids {tuple(input_ids.shape)}; got {tuple(labels.shape)}")
        skip = decide_skip_logits(skip_logits, self.training, labels is not None)
        hidden = self.hidden_states(input_ids)
        if skip:
            return {"loss": self._fused_loss(hidden, labels) + self.auxiliary_loss()}
        logits = F.linear(hidden, self.head_weight)
        if labels is None:
            return {"logits": logits}
        loss = F.cross_entropy(logits.flatten(0, 1).float(), self._targets(labels), ignore_index=IGNORE_INDEX)
        return {"loss": loss + self.auxiliary_loss(), "logits": logits}

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, generator: torch.Generator | None = None,
                 use_cache: bool = True) -> torch.Tensor:
        """Continue input_ids (B, T) by `max_new_tokens` tokens; returns (B, T + max_new_tokens).

        temperature 0 is greedy; top_k / top_p restrict sampling (see `nlp.sampling`). With
        `use_cache`, each step runs only the new token against cached keys and values while the
        sequence fits block_size; beyond it (or without the cache) each step runs the last
        block_size tokens in full. Both give the same tokens."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0; got {max_new_tokens}")
        sampling = Sampling(temperature, top_k, top_p)
        block_size, weight = self.config.block_size, self.head_weight
        cache = self.new_cache(input_ids.shape[0]) if use_cache else None
        ids, step = input_ids, input_ids
        for _ in range(max_new_tokens):
            if cache is not None and cache.length + step.shape[1] <= block_size:
                hidden = self.hidden_states(step, cache)
            else:
                cache = None
                hidden = self.hidden_states(ids[:, -block_size:])
            step = next_token(F.linear(hidden[:, -1], weight), sampling, generator)
            ids = torch.cat([ids, step], dim=1)
        return ids
