"""ViT on the fused `zoo.nn` layers.

    pixel_values (B, C, H, W) -> patches (B, N, W) by a stride-P convolution -> [class token; patches]
    + learned positions (interpolated bicubically for other image sizes) -> dropout -> pre-LN
    TransformerBlocks (exact GELU) -> final LayerNorm -> head:
    "none":           {"last_hidden_state" (B, 1+N, W), "pooler_output" (B, W) = tanh(pooler(h[:, 0]))}
    "classification": {"logits" (B, num_labels)} from the class token (+ "loss" with labels); in
                      `forward` the last block computes only the class token's output (its keys
                      and values from every token), all the classifier reads (a pipeline's stages
                      run whole blocks)

State-dict names: embeddings.{patch.{weight,bias}, cls_token (1, 1, W), positions (1, 1+N, W)},
blocks.N.{norm1,attn.{q,k,v,out},norm2,mlp.fc1,mlp.fc2}.*, norm.*, pooler.* or classifier.*.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from vision.vit.config import ViTConfig
from zoo.nn import Norm, TransformerBlock, TransformerBlockConfig, block_plan, dropout
from zoo.nn.init import init_transformer_
from zoo.plan import Carry, ModelPlan, PipelineSplit
from zoo.registry import register


def block_config(config: ViTConfig) -> TransformerBlockConfig:
    """The `TransformerBlock` shape of a ViT's blocks."""
    return TransformerBlockConfig(
        width=config.hidden_size, heads=config.num_attention_heads,
        mlp_ratio=config.intermediate_size / config.hidden_size, activation="gelu", prenorm=True, causal=False,
        dropout=config.hidden_dropout_prob, attention_dropout=config.attention_probs_dropout_prob, bias=True,
        eps=config.layer_norm_eps, recompute_attention=config.recompute_attention)


def interpolate_positions(positions: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(1, 1+G*G, W) learned positions of a G x G grid -> (1, 1+h*w, W) for an h x w grid (bicubic,
    the class token's position unchanged)."""
    side = int(round((positions.shape[1] - 1) ** 0.5))
    if (side, side) == grid:
        return positions
    width = positions.shape[-1]
    patches = positions[:, 1:].reshape(1, side, side, width).permute(0, 3, 1, 2)
    patches = F.interpolate(patches.float(), size=grid, mode="bicubic", align_corners=False).to(positions.dtype)
    return torch.cat([positions[:, :1], patches.permute(0, 2, 3, 1).reshape(1, -1, width)], dim=1)


class PatchEmbeddings(nn.Module):
    """(B, C, H, W) pixels -> (B, 1+N, W) tokens: a stride-P convolution into patches, the class
    token in front, learned positions added (interpolated for other image sizes), dropout."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config, width = config, config.hidden_size
        self.patch = nn.Conv2d(config.num_channels, width, config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.zeros(1, 1 + config.grid ** 2, width))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        c, p = self.config.num_channels, self.config.patch_size
        if pixel_values.ndim != 4 or pixel_values.shape[1] != c:
            raise ValueError(f"pixel_values must have shape (B, {c}, H, W); got {tuple(pixel_values.shape)}")
        if pixel_values.shape[2] % p or pixel_values.shape[3] % p:
            raise ValueError(f"pixel_values height and width must be multiples of patch_size={p}; "
                             f"got {tuple(pixel_values.shape[2:])}")
        patches = self.patch(pixel_values.to(self.patch.weight.dtype))
        grid = tuple(patches.shape[2:])
        tokens = torch.cat([self.cls_token.expand(patches.shape[0], -1, -1), patches.flatten(2).transpose(1, 2)], 1)
        tokens = tokens + interpolate_positions(self.positions, grid)
        return dropout(tokens, self.config.hidden_dropout_prob, self.training)


CLASS_TOKEN = slice(0, 1)
"""The class token's position among a ViT's tokens: all the classifier reads of the last block."""

_EMBEDDING_NAMES = ("patch.weight", "patch.bias", "cls_token", "positions")


def _move_into_embeddings(_module, state_dict, prefix, *args) -> None:
    """Checkpoints written before the embeddings had their module hold them at the top level."""
    for name in _EMBEDDING_NAMES:
        if prefix + name in state_dict:
            state_dict[f"{prefix}embeddings.{name}"] = state_dict.pop(prefix + name)


@register("vit", ViTConfig)
class ViT(nn.Module):
    """forward(pixel_values (B, C, H, W), labels (B,) class ids) -> dict (see the module docstring).
    H and W must be multiples of patch_size; sizes other than image_size interpolate the positions."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        width = config.hidden_size
        self.embeddings = PatchEmbeddings(config)
        self.register_load_state_dict_pre_hook(_move_into_embeddings)
        self.blocks = nn.ModuleList(TransformerBlock(block_config(config)) for _ in range(config.num_hidden_layers))
        self.norm = Norm(width, "layer", config.layer_norm_eps)
        self.classifier = nn.Linear(width, config.num_labels) if config.head == "classification" else None
        self.pooler = nn.Linear(width, width) if config.head == "none" else None
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    @staticmethod
    def example_batch(config: ViTConfig, rows: int) -> dict[str, torch.Tensor]:
        """A training micro batch of `rows` random images of image_size and their classes: what
        `zoo plan` estimates a step with."""
        if config.head != "classification":
            raise ValueError(f"ViTConfig.head={config.head!r} has no training loss; a plan needs 'classification'")
        return {"pixel_values": torch.randn(rows, config.num_channels, config.image_size, config.image_size),
                "labels": torch.randint(0, config.num_labels, (rows,))}

    def parallel_plan(self) -> ModelPlan:
        """Each block is one shard and recompute unit and holds two tensor-parallel regions
        (`block_plan`). No sequence parallelism: 1 + (image / patch)^2 positions rarely split. A
        pipeline's first stage holds the embeddings, its last the final norm and the head."""
        head = ("classifier",) if self.classifier is not None else ()
        return replace(block_plan("blocks.*", block_config(self.config)),
                       pipeline=PipelineSplit(pre=("embeddings",), post=("norm", *head)))

    @torch.no_grad()
    def init_weights(self) -> None:
        """Truncated-normal-free ViT initialisation: N(0, 0.02) linears, class token and positions,
        the patch convolution like a linear over the flattened patch, zero biases, unit norms."""
        init_transformer_(self)
        embeddings = self.embeddings
        for tensor in (embeddings.cls_token, embeddings.positions, embeddings.patch.weight):
            nn.init.normal_(tensor, std=0.02)
        nn.init.zeros_(embeddings.patch.bias)

    def embed(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, 1+N, W) tokens with positions."""
        return self.embeddings(pixel_values)

    def encode(self, pixel_values: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """The final-normed hidden states (B, 1+N, W); index 0 is the class token. rows: the
        positions the last block computes (None: all): (B, R, W) of those positions, the earlier
        blocks computing all (the classifier reads only the class token: slice(0, 1))."""
        x = self.embed(pixel_values)
        last = len(self.blocks) - 1
        for index, block in enumerate(self.blocks):
            x = block(x) if rows is None or index < last else block(x, rows=rows)
        return self.norm(x)

    def pipeline_enter(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> Carry:
        """First pipeline stage: {"hidden": (B, 1+N, W) tokens}."""
        return {"hidden": self.embed(pixel_values)}

    def pipeline_block(self, block: nn.Module, carry: Carry) -> Carry:
        """One block on {"hidden": (B, 1+N, W)}."""
        return {"hidden": block(carry["hidden"])}

    def pipeline_exit(self, carry: Carry, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Last pipeline stage: the classification loss from carry["hidden"] (B, 1+N, W)."""
        if labels is None or self.classifier is None:
            raise ValueError("training a ViT needs a classification head and labels in the batch")
        return self._classify(self.norm(carry["hidden"]), labels)["loss"]

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if self.classifier is None:
            if labels is not None:
                raise ValueError("labels need a head; this ViT has head='none'")
            hidden = self.encode(pixel_values)
            return {"last_hidden_state": hidden, "pooler_output": torch.tanh(self.pooler(hidden[:, 0]))}
        return self._classify(self.encode(pixel_values, rows=CLASS_TOKEN), labels)

    def _classify(self, hidden: torch.Tensor, labels: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """{"logits" (B, num_labels)} from the class token of hidden (B, 1+N, W), + "loss" with labels."""
        logits = self.classifier(hidden[:, 0])
        output = {"logits": logits}
        if labels is not None:
            if labels.shape != logits.shape[:1]:
                raise ValueError(f"labels must have shape (B,) = ({logits.shape[0]},); got {tuple(labels.shape)}")
            output["loss"] = F.cross_entropy(logits.float(), labels)
        return output
