"""The transducer speech recogniser: Conformer encoder, stateless decoder, joiner, and its loss.

    input_features (B, T, F) raw log-mel, attention_mask (B, T) 1 = frame, labels (B, U) token ids
    padded with -100 (or encoder_outputs (B, T', E) already encoded, attention_mask (B, T'))
    -> normalised (the stored feature mean/std for a Conformer encoder, Whisper's fixed scaling for a
       Whisper encoder), SpecAugment in training
    -> encoder (B, T', E); decoder on [blank, labels] (B, U+1, D); joiner; loss
    -> {"loss", "simple_loss", "transducer_loss"} (without labels: {"encoder_out", "encoder_lengths"})

Losses (asr.losses) run in float32 lattices with autocast off: "full" (the fused RNN-T loss on the
(B, T', U+1, V) joiner output), "pruned" (simple loss + pruned loss with icefall's warm-up:
over warm_steps the simple loss's weight falls from 1 to simple_loss_scale and the pruned loss's
rises from 0.1 to 1), "samplewise" (the full loss one group of samples at a time, within
samplewise_memory_budget bytes) and "samplewise_pruned" (both).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import nn

from asr.conformer import CONFORMER_SIZES, ConformerConfig, ConformerEncoder
from asr.decoder import Joiner, StatelessDecoder
from asr.features import FeatureConfig, SpecAugment
from asr.losses import Pruning, pruned_transducer_losses, rnnt_loss, samplewise_rnnt_loss
from asr.whisper_encoder import WhisperEncoder, WhisperEncoderConfig, whisper_scaled
from zoo.nn.cross_entropy import IGNORE_INDEX
from zoo.plan import Carry, ModelPlan, PipelineSplit
from zoo.registry import register

LossKind = Literal["full", "pruned", "samplewise", "samplewise_pruned"]
LOSS_KINDS = ("full", "pruned", "samplewise", "samplewise_pruned")
EncoderKind = Literal["conformer", "whisper"]
ENCODERS = {"conformer": (ConformerConfig, ConformerEncoder), "whisper": (WhisperEncoderConfig, WhisperEncoder)}
"""Encoder kinds: their config class and module."""


@dataclass
class TransducerConfig:
    """Shape and training objective of a transducer."""

    vocab_size: int = 500
    """Output tokens, the blank included."""
    blank_id: int = 0
    """Id of the blank token."""
    encoder_kind: EncoderKind = "conformer"
    """"conformer" (`asr.conformer`, features normalised with the stored training mean and std) or
    "whisper" (`asr.whisper_encoder`, Whisper's fixed feature scaling; importable from a pretrained
    Whisper checkpoint)."""
    encoder: ConformerConfig | WhisperEncoderConfig = field(default_factory=lambda: CONFORMER_SIZES["tiny"])
    """Encoder shape, of the config class of encoder_kind (its input_dim is the number of feature bins)."""
    decoder_dim: int = 256
    """Stateless decoder width (divisible by 4)."""
    joiner_dim: int = 256
    """Joiner width."""
    context_size: int = 2
    """Tokens the decoder sees."""
    loss: LossKind = "pruned"
    """Training objective: "full", "pruned", "samplewise" or "samplewise_pruned"."""
    prune_range: int = 5
    """Window width S of the pruned losses."""
    simple_loss_scale: float = 0.5
    """Weight of the simple loss after warm-up (pruned losses)."""
    warm_steps: int = 2000
    """Optimizer steps of the pruned losses' warm-up."""
    samplewise_memory_budget: int = 256 * 2**20
    """Bytes one group of the sample-wise losses may use for its joiner activations and lattice."""
    spec_augment: SpecAugment | None = field(default_factory=SpecAugment)
    """Masks applied to the normalised features in training (None: none)."""

    def __post_init__(self) -> None:
        if self.encoder_kind not in ENCODERS:
            raise ValueError(f"TransducerConfig.encoder_kind must be one of {list(ENCODERS)}; got {self.encoder_kind!r}")
        config_class = ENCODERS[self.encoder_kind][0]
        if isinstance(self.encoder, dict):  # as read back from config.json
            self.encoder = config_class(**self.encoder)
        if not isinstance(self.encoder, config_class):
            raise TypeError(f"TransducerConfig.encoder must be a {config_class.__name__} for encoder_kind "
                            f"{self.encoder_kind!r}; got a {type(self.encoder).__name__}")
        if isinstance(self.spec_augment, dict):
            self.spec_augment = SpecAugment(**self.spec_augment)
        if self.vocab_size < 2 or not 0 <= self.blank_id < self.vocab_size:
            raise ValueError(f"TransducerConfig needs vocab_size >= 2 and 0 <= blank_id < vocab_size; "
                             f"got {self.vocab_size} and {self.blank_id}")
        if self.loss not in LOSS_KINDS:
            raise ValueError(f"TransducerConfig.loss must be one of {list(LOSS_KINDS)}; got {self.loss!r}")
        if self.prune_range < 2 or self.warm_steps < 0 or not 0 < self.simple_loss_scale <= 1:
            raise ValueError(f"TransducerConfig needs prune_range >= 2, warm_steps >= 0, simple_loss_scale in (0, 1]; "
                             f"got {self.prune_range}, {self.warm_steps}, {self.simple_loss_scale}")

    @classmethod
    def sized(cls, size: str, **fields) -> TransducerConfig:
        """A config with the preset encoder `size` ("tiny", "small"); `fields` set the rest
        (an `encoder_*` field such as encoder_dropout=0.0 sets that encoder field)."""
        if size not in CONFORMER_SIZES:
            raise ValueError(f"size must be one of {sorted(CONFORMER_SIZES)}; got {size!r}")
        encoder = replace(CONFORMER_SIZES[size], **{k[8:]: fields.pop(k) for k in list(fields) if k.startswith("encoder_")})
        return cls(encoder=encoder, **fields)


@register("transducer", TransducerConfig)
class Transducer(nn.Module):
    """forward(input_features=None, attention_mask=None, labels=None, encoder_outputs=None) -> dict (see
    the module docstring)."""

    def __init__(self, config: TransducerConfig) -> None:
        super().__init__()
        self.config = config
        width, vocab = config.encoder.width, config.vocab_size
        self.encoder = ENCODERS[config.encoder_kind][1](config.encoder)
        self.decoder = StatelessDecoder(vocab, config.decoder_dim, config.context_size, config.blank_id)
        self.joiner = Joiner(width, config.decoder_dim, config.joiner_dim, vocab)
        self.simple_am = nn.Linear(width, vocab)
        self.simple_lm = nn.Linear(config.decoder_dim, vocab)
        self.register_buffer("feature_mean", torch.zeros(config.encoder.input_dim))
        self.register_buffer("feature_std", torch.ones(config.encoder.input_dim))
        self.training_step = 0

    PLAN_SECONDS = 10
    """Seconds of audio per utterance in `example_batch`."""
    PLAN_TOKENS = 100
    """Non-blank output tokens per utterance in `example_batch`."""

    @staticmethod
    def example_batch(config: TransducerConfig, rows: int) -> dict[str, torch.Tensor]:
        """A training micro batch of `rows` utterances of PLAN_SECONDS seconds: input_features (rows,
        T, F) random log-mel frames (T = 1001 for 10 s at a 10 ms hop, F = encoder.input_dim), an
        attention_mask (rows, T) of ones and labels (rows, PLAN_TOKENS) of random non-blank tokens:
        what `zoo plan` estimates a step with."""
        features = FeatureConfig()
        frames = int(features.frames(torch.tensor(Transducer.PLAN_SECONDS * features.sample_rate)))
        labels = torch.randint(0, config.vocab_size - 1, (rows, Transducer.PLAN_TOKENS))
        return {"input_features": torch.randn(rows, frames, config.encoder.input_dim),
                "attention_mask": torch.ones(rows, frames, dtype=torch.long),
                "labels": labels + (labels >= config.blank_id).long()}

    def parallel_plan(self) -> ModelPlan:
        """The encoder's blocks are the shards and recompute units (`_whisper_plan` for a Whisper
        encoder). Each Conformer block is one shard and recompute unit; its two feed-forwards and its
        attention are tensor-parallel regions (fc1 and q, k, v column-, fc2 and out row-parallel). A
        pipeline's first stage holds the feature statistics and the subsampling, its last the
        decoder, joiner and the pruned loss's linears. config.samplewise_memory_budget sizes the
        sample-wise losses' groups; the subsampling convolutions are recomputed with the blocks."""
        if self.config.encoder_kind == "whisper":
            return self._whisper_plan()
        blocks = "encoder.blocks.*"
        attn = f"{blocks}.attn.attn"
        return ModelPlan(blocks=(blocks,), recompute=("encoder.subsampling",),
                         pipeline=PipelineSplit(pre=("encoder.subsampling", "feature_mean", "feature_std"),
                                                post=("decoder", "joiner", "simple_am", "simple_lm")),
                         colwise=(f"{blocks}.ff1.mlp.fc1", f"{blocks}.ff2.mlp.fc1", f"{attn}.q", f"{attn}.k", f"{attn}.v"),
                         rowwise=(f"{blocks}.ff1.mlp.fc2", f"{blocks}.ff2.mlp.fc2", f"{attn}.out"),
                         regions=(f"{blocks}.ff1.mlp", f"{blocks}.ff2.mlp", attn),
                         heads=tuple((f"{attn}.{name}", self.config.encoder.width // self.config.encoder.heads)
                                     for name in "qkv"),
                         chunk_memory="samplewise_memory_budget")

    def _whisper_plan(self) -> ModelPlan:
        """The Whisper encoder's plan (`WhisperEncoder.plan`); a pipeline's first stage holds the
        convolutions and positions, its last the final norm, decoder, joiner and the pruned loss's linears."""
        return replace(self.encoder.plan("encoder"), chunk_memory="samplewise_memory_budget",
                       pipeline=PipelineSplit(pre=("encoder.conv1", "encoder.conv2", "encoder.positions", "feature_mean",
                                                   "feature_std"),
                                              post=("encoder.norm", "decoder", "joiner", "simple_am", "simple_lm")))

    def with_chunk_frames(self, chunk_frames: int) -> Transducer:
        """This transducer, trained with dynamic chunks (`ConformerConfig.dynamic_chunks`), encoding in
        chunks of chunk_frames (0: full context): a Transducer on the same storage (no weight is copied)."""
        encoder = self.config.encoder
        if self.config.encoder_kind != "conformer" or not encoder.dynamic_chunks:
            raise ValueError("with_chunk_frames needs a Conformer transducer trained with dynamic chunks "
                             "(--model.encoder.dynamic_chunks N); this one encodes in one way only")
        with torch.device("meta"):
            twin = Transducer(replace(self.config, encoder=replace(encoder, chunk_frames=chunk_frames)))
        twin.load_state_dict(self.state_dict(), assign=True)
        twin.training_step = self.training_step
        return twin.train(self.training)

    def set_training_step(self, step: int) -> None:
        """Called by the trainer before each optimizer step: drives the pruned losses' warm-up."""
        self.training_step = step

    @torch.no_grad()
    def set_feature_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Store the global per-bin mean and std (F,) of the training features (a Whisper encoder's
        scaling is fixed and does not read them)."""
        if mean.shape != self.feature_mean.shape or std.shape != self.feature_std.shape or (std <= 0).any():
            raise ValueError(f"mean and std must be {tuple(self.feature_mean.shape)} with std > 0; "
                             f"got {tuple(mean.shape)} and {tuple(std.shape)}")
        self.feature_mean.copy_(mean)
        self.feature_std.copy_(std)

    def encode(self, input_features: torch.Tensor, attention_mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F) raw log-mel and (B, T) frame mask -> encoder output (B, T', E), lengths (B,)."""
        return self.encoder(*self._normalised(input_features, attention_mask))

    def pipeline_enter(self, input_features: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       labels: torch.Tensor | None = None) -> Carry:
        """First pipeline stage: normalised (and augmented) features through the subsampling, as
        `ConformerEncoder.enter` carries them."""
        return self.encoder.enter(*self._normalised(input_features, attention_mask))

    def pipeline_block(self, block: nn.Module, carry: Carry) -> Carry:
        """One Conformer block."""
        return self.encoder.run_block(block, carry)

    def pipeline_exit(self, carry: Carry, input_features: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      labels: torch.Tensor | None = None) -> torch.Tensor:
        """Last pipeline stage: the transducer loss of the encoder output carry["hidden"] (B, T', E)."""
        if labels is None:
            raise ValueError("training a transducer needs labels in the batch")
        return self._transducer_loss(*self.encoder.leave(carry), labels)["loss"]

    def _normalised(self, input_features: torch.Tensor, attention_mask: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F) raw log-mel -> normalised (with the stored statistics, or Whisper's scaling) and,
        in training, SpecAugmented features in the encoder's dtype, and the (B,) frame counts."""
        if input_features.ndim != 3 or input_features.shape[-1] != self.feature_mean.numel():
            raise ValueError(f"input_features must be (B, T, {self.feature_mean.numel()}); got {tuple(input_features.shape)}")
        lengths = (attention_mask.sum(1) if attention_mask is not None
                   else torch.full(input_features.shape[:1], input_features.shape[1], device=input_features.device))
        if self.config.encoder_kind == "whisper":
            x = whisper_scaled(input_features, lengths)
        else:
            x = (input_features - self.feature_mean) / self.feature_std
        if self.training and self.config.spec_augment is not None:
            x = self.config.spec_augment(x, lengths)
        return x.to(self.encoder.input_dtype), lengths

    def loss_scales(self) -> tuple[float, float]:
        """(simple, pruned) loss weights at the current training step (pruned losses)."""
        c = self.config
        if self.training_step >= c.warm_steps:
            return c.simple_loss_scale, 1.0
        progress = self.training_step / c.warm_steps
        return 1.0 - progress * (1.0 - c.simple_loss_scale), 0.1 + 0.9 * progress

    def forward(self, input_features: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, encoder_outputs: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        """Encode input_features, or take `encoder_outputs` (B, T', E) already encoded (as Hugging Face's
        encoder-decoder models do; attention_mask (B, T') then marks their frames): what
        `asr.encoder_cache` feeds while the encoder is frozen."""
        if (input_features is None) == (encoder_outputs is None):
            raise ValueError("Transducer.forward takes one of input_features and encoder_outputs; got "
                             f"{'both' if input_features is not None else 'neither'}")
        if encoder_outputs is None:
            encoder_out, lengths = self.encode(input_features, attention_mask)
        else:
            if encoder_outputs.ndim != 3 or encoder_outputs.shape[-1] != self.config.encoder.width:
                raise ValueError(f"encoder_outputs must be (B, T', {self.config.encoder.width}); got "
                                 f"{tuple(encoder_outputs.shape)}")
            encoder_out = encoder_outputs
            lengths = (attention_mask.sum(1) if attention_mask is not None else
                       torch.full(encoder_out.shape[:1], encoder_out.shape[1], device=encoder_out.device))
        if labels is None:
            return {"encoder_out": encoder_out, "encoder_lengths": lengths}
        return self._transducer_loss(encoder_out, lengths, labels)

    def _transducer_loss(self, encoder_out: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor
                         ) -> dict[str, torch.Tensor]:
        """The configured loss of encoder_out (B, T', E) with (B,) lengths against labels (B, U)."""
        if labels.ndim != 2 or labels.shape[0] != encoder_out.shape[0]:
            raise ValueError(f"labels must be (B, U) = ({encoder_out.shape[0]}, U); got {tuple(labels.shape)}")
        target_lengths = (labels != IGNORE_INDEX).sum(1)
        targets = labels.masked_fill(labels == IGNORE_INDEX, self.config.blank_id)
        blank = torch.full_like(targets[:, :1], self.config.blank_id)
        decoder_out = self.decoder(torch.cat([blank, targets], dim=1))
        with torch.autocast(encoder_out.device.type, enabled=False):
            return self._loss(encoder_out, decoder_out, targets, lengths, target_lengths)

    def _loss(self, encoder_out, decoder_out, targets, lengths, target_lengths) -> dict[str, torch.Tensor]:
        c, joiner, blank = self.config, self.joiner, self.config.blank_id
        if c.loss == "full":
            logits = joiner(encoder_out[:, :, None], decoder_out[:, None])
            loss = rnnt_loss(logits, targets, lengths, target_lengths, blank, gradient_in_logits=True)
            return {"loss": loss, "transducer_loss": loss.detach()}
        if c.loss == "samplewise":
            loss = samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, lengths, target_lengths, blank,
                                        memory_budget=c.samplewise_memory_budget)
            return {"loss": loss, "transducer_loss": loss.detach()}
        simple_scale, pruned_scale = self.loss_scales()
        if c.loss == "pruned":
            simple, pruned = pruned_transducer_losses(
                self.simple_am(encoder_out), self.simple_lm(decoder_out), joiner.encoder_proj(encoder_out),
                joiner.decoder_proj(decoder_out), joiner.combine, targets, lengths, target_lengths, c.prune_range, blank)
            return {"loss": simple_scale * simple + pruned_scale * pruned, "simple_loss": simple.detach(),
                    "transducer_loss": pruned.detach()}
        # One weighted loss per group: pruned_scale * (simple_scale / pruned_scale * simple + pruned).
        pruning = Pruning(c.prune_range, self.simple_am, self.simple_lm, simple_scale / pruned_scale)
        loss, simple, pruned = samplewise_rnnt_loss(encoder_out, decoder_out, joiner, targets, lengths, target_lengths,
                                                    blank, memory_budget=c.samplewise_memory_budget, pruning=pruning)
        return {"loss": pruned_scale * loss, "simple_loss": simple, "transducer_loss": pruned}
