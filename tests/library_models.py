"""Models the zoo did not write: transformers' own classes built small from their configs (random
weights, seeded alike on every rank), with data they train on, for the bring-your-own-model matrix.
Nothing here says how to parallelise them: the trainers read the plans transformers ships.

Dropout is 0 (so every layout computes the same function); the key projection has no bias where
the family allows it (its gradient is zero up to rounding, which AdamW turns into full-size steps).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import transformers
from torch import nn

from helpers import lm_examples
from tiny_models import digit_examples, mlm_examples

WIDTH = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
"""Every family's size: width 32, feed-forward 64, 2 layers, 4 heads of 8."""


def _decoder(model_class: type, config_class: type, **settings) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return model_class(config_class(vocab_size=48, **WIDTH, **settings))
    return build


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=8, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **WIDTH))


def _bert() -> nn.Module:
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=50, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **WIDTH))


LIBRARY_MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], list[dict[str, torch.Tensor]]]]] = {
    "llama": (_decoder(transformers.LlamaForCausalLM, transformers.LlamaConfig, num_key_value_heads=2), lm_examples),
    "qwen3": (_decoder(transformers.Qwen3ForCausalLM, transformers.Qwen3Config, num_key_value_heads=2, head_dim=8),
              lm_examples),
    "gemma3": (_decoder(transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig, num_key_value_heads=2, head_dim=8,
                        sliding_window=4, layer_types=["sliding_attention", "full_attention"]), lm_examples),
    "mistral": (_decoder(transformers.MistralForCausalLM, transformers.MistralConfig, num_key_value_heads=2,
                         sliding_window=8), lm_examples),
    "neox": (_decoder(transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig, attention_bias=False,
                      hidden_dropout=0.0, attention_dropout=0.0), lm_examples),
    "bert": (_bert, mlm_examples),
    "vit": (_vit, partial(digit_examples, channels=3, size=16)),
}
"""family -> (factory, examples(count)): Llama (grouped-query attention), Qwen3 (q/k norms, which
transformers' plan keeps whole with their gradients summed), Gemma 3 (tied embeddings, a sliding-
window layer beside a full one, q/k norms), Mistral (sliding window), GPT-NeoX (fused q/k/v), BERT
masked-LM with padding and ViT classification of 16 x 16 RGB images (neither ships a tensor-parallel
plan)."""
