"""Tiny models of every zoo family and data they train on, shared by the parity tests (multi-process
and compiled): factories seeded alike on every rank, examples from fixed generators."""

from __future__ import annotations

import torch
from torch import nn

from asr.data import collate_speech
from helpers import lm_examples, tiny_gpt
from nlp.bert import Bert, BertConfig
from nlp.translation import Translator, TranslatorConfig
from parity_models import FeedForwardLM, GainedLM
from protein.data import CropConfig, FoldingExamples, collate_folding, load_chains
from protein.evoformer import EvoformerConfig
from protein.model import FoldConfig, FoldingModel
from protein.structure_module import StructureConfig
from tiny_transducer import tiny, tiny_whisper, token_utterances
from vision.vit import ViT, ViTConfig


def mlm_examples(count: int) -> list[dict[str, torch.Tensor]]:
    """BERT masked-LM examples of 16 tokens, the last ones of some padded, every fourth labelled."""
    generator = torch.Generator().manual_seed(3)
    examples = []
    for index in range(count):
        ids = torch.randint(1, 50, (16,), generator=generator)
        mask = (torch.arange(16) < 16 - index % 5).long()
        labels = torch.where((torch.arange(16) % 4 == 1) & (mask == 1), ids, -100)
        examples.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return examples


def digit_examples(count: int, channels: int = 1, size: int = 8) -> list[dict[str, torch.Tensor]]:
    """size x size images of `channels` channels in 3 classes (a bright row at the class's place, a
    quarter of the height apart, plus noise)."""
    generator = torch.Generator().manual_seed(4)
    examples = []
    for index in range(count):
        image = 0.1 * torch.randn(channels, size, size, generator=generator)
        image[:, size // 4 * (index % 3)] += 1.0
        examples.append({"pixel_values": image, "labels": torch.tensor(index % 3)})
    return examples


def speech_examples(count: int) -> list[dict[str, torch.Tensor]]:
    features, mask, labels = token_utterances(count, seed=5)
    return [{"input_features": x[: int(m.sum())], "labels": y[y >= 0]} for x, m, y in zip(features, mask, labels)]


def tiny_fold(dropout: float = 0.0, max_recycles: int = 1) -> nn.Module:
    torch.manual_seed(0)
    evoformer = EvoformerConfig(msa_dim=16, pair_dim=16, blocks=2, msa_heads=2, pair_heads=2, head_dim=8,
                                outer_product_dim=4, triangle_dim=16, msa_dropout=dropout, pair_dropout=dropout)
    return FoldingModel(FoldConfig(evoformer=evoformer, structure=StructureConfig(single_dim=32, layers=2, heads=2,
                                                                                 head_dim=8), max_recycles=max_recycles))


def fold_examples(count: int):
    """Crops of 16 residues and 4 MSA rows of real chains at least that long."""
    chains = [chain for chain in load_chains("train") if len(chain.sequence) >= 16][:count]
    return FoldingExamples(chains, CropConfig(crop_size=16, msa_rows=4, withhold_profile=0.0))


def tiny_translator(marian: bool = False) -> nn.Module:
    """A 2 + 2-layer translator of width 32 over 50 tokens: pre-norm (the default), or shaped like
    Marian (post-norm, swish, a final logits bias, no padding id, the decoder starting from zeros)."""
    torch.manual_seed(0)
    shape = dict(prenorm=False, activation="silu", final_logits_bias=True, pad_token_id=None, decoder_start_token_id=1,
                 zero_start_embedding=True) if marian else {}
    model = Translator(TranslatorConfig(vocab_size=50, width=32, heads=4, encoder_layers=2, decoder_layers=2,
                                        ffn_width=64, max_positions=16, dropout=0.0, label_smoothing=0.1, **shape))
    if marian:
        with torch.no_grad():
            model.logits_bias.copy_(0.1 * torch.randn(50))
    return model


def translation_examples(count: int) -> list[dict[str, torch.Tensor]]:
    """Sources of 12 tokens, the last ones of some padded (attention_mask 0), and their targets of
    10: the source's first tokens reversed then EOS (2), -100 after."""
    generator = torch.Generator().manual_seed(6)
    examples = []
    for index in range(count):
        ids = torch.randint(3, 50, (12,), generator=generator)
        length = 12 - index % 4
        labels = torch.full((10,), -100)
        kept = min(length, 9)
        labels[:kept], labels[kept] = ids[:kept].flip(0), 2
        examples.append({"input_ids": ids, "attention_mask": (torch.arange(12) < length).long(), "labels": labels})
    return examples


def tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    return Bert(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=24, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, head="mlm"))


def tiny_vit() -> nn.Module:
    """A ViT whose biases start non-zero: zero-initialised ones stay small after 3 steps, where
    AdamW's rounding noise is largest relative to them."""
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, num_labels=3))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    return model


TP_MODELS = {
    "gpt": (lambda: tiny_gpt(bias=True), lm_examples, None),
    "mqa": (lambda: tiny_gpt(n_head=4, n_kv_head=1, vocab_size=49), lm_examples, None),
    "moe": (lambda: tiny_gpt(n_experts=4, moe_top_k=2), lm_examples, None),
    "custom": (FeedForwardLM, lm_examples, None),
    "gained": (GainedLM, lm_examples, None),
    "bert": (tiny_bert, mlm_examples, None),
    "translator": (tiny_translator, translation_examples, None),
    "marian": (lambda: tiny_translator(marian=True), translation_examples, None),
    "vit": (tiny_vit, digit_examples, None),
    "conformer": (lambda: tiny(loss="full"), speech_examples, collate_speech),
    "whisper": (lambda: tiny_whisper(loss="full"), speech_examples, collate_speech),
    "fold": (tiny_fold, fold_examples, collate_folding),
    "fold_dropout": (lambda: tiny_fold(dropout=0.25), fold_examples, collate_folding),
}
"""Models of the tensor-parallel parity runs (factory, examples, collate): GPT with biases
(row-parallel biases are added once), multi-query GPT (keys and values replicated), GPT with
mixture-of-experts blocks (its experts split by hidden width, its router replicated; also the
expert-parallel and compiled runs), the models of parity_models.py
(the last three with 49 vocabulary rows, which split unevenly: 25 + 24; the gained one with a learned
gain in each region, kept whole on every rank), BERT masked-LM with padding,
a ViT classifier, the translators (pre-norm, and Marian-shaped with a whole final logits bias beside
its embedding, which then stays whole: each cross-attention's memory enters its region whole),
the Conformer transducer, the transducer on a Whisper encoder, the folding model (Evoformer with dynamic axial
parallelism: 4 MSA rows and 16 residues split over the ranks), with dropout 0.25 too (its masks,
shared along rows or columns, are the same on any number of ranks)."""
