"""Translating text with a zoo translator: `translator_named`, `load_translator`, `translate`.

A zoo translator entry's config.json records its `languages` ([source, target], ISO codes) and its
`tokenizer` spec (`nlp.tokenizers.tokenizer_from_spec`), so a model is found by name, by its
folder or by its language pair ("zh-en").
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from nlp.tokenizers import tokenizer_from_spec
from nlp.translation.decode import BeamSettings
from nlp.translation.model import Translator
from zoo.model_folder import CONFIG_FILE
from zoo.store import list_models, load, locate, read_config

log = logging.getLogger(__name__)


def language_pairs() -> dict[str, str]:
    """"source-target" -> the zoo name of a translator between them, for every zoo entry that records
    its languages."""
    pairs = {}
    for name in list_models():
        languages = read_config(name).get("languages")
        if languages:
            pairs.setdefault("-".join(languages), name)
    return pairs


def translator_named(name_or_pair: str) -> str:
    """The zoo name (or model folder) of a translator given by its name, its folder or its
    language pair "source-target"; ValueError listing the known pairs otherwise."""
    if name_or_pair in list_models() or (Path(name_or_pair) / CONFIG_FILE).is_file():
        if "languages" not in read_config(name_or_pair):
            raise ValueError(f"zoo model {name_or_pair!r} is not a translator (its config.json records no 'languages')")
        return name_or_pair
    pairs = language_pairs()
    if name_or_pair not in pairs:
        raise ValueError(f"no translator {name_or_pair!r}: neither a zoo name nor a known language pair; "
                         f"pairs: {sorted(pairs)}")
    return pairs[name_or_pair]


def load_translator(name_or_pair: str, device: str | torch.device = "cpu"):
    """(Translator, tokenizer) of the zoo translator given by name or language pair."""
    name = translator_named(name_or_pair)
    model = load(name, device=device)
    if not isinstance(model, Translator):
        raise ValueError(f"zoo model {name!r} loads as {type(model).__name__}; expected a Translator")
    return model, tokenizer_from_spec(read_config(name)["tokenizer"], locate(name))


@torch.no_grad()
def translate(model: Translator, tokenizer, texts: list[str], settings: BeamSettings = BeamSettings(),
              batch_size: int = 16) -> list[str]:
    """The translation of each text, in order. Texts are decoded `batch_size` at a time, longest
    first (similar lengths pad little). An empty text, or one whose tokens exceed the model's
    positions, is refused with its index (nothing is cut)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    limit = model.config.max_positions
    encoded = []
    for index, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"text {index} is empty; a translator needs something to translate")
        ids = tokenizer.encode(text)
        if len(ids) > limit:
            raise ValueError(f"text {index} has {len(ids)} tokens; this translator reads at most {limit} "
                             "(max_positions): split it into sentences")
        encoded.append(ids)
    order = sorted(range(len(texts)), key=lambda i: -len(encoded[i]))
    results: list[str] = [""] * len(texts)
    device = model.head_weight.device
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        batch = tokenizer.batch([encoded[i] for i in rows], model.filler_token_id)
        outputs = model.generate(batch["input_ids"].to(device), batch["attention_mask"].to(device), settings)
        for row, ids in zip(rows, outputs):
            results[row] = tokenizer.decode(ids)
            if ids and ids[-1] != model.config.eos_token_id:
                log.warning("text %d reached the maximum target length (%d tokens) before its end; raise "
                            "max_length_ratio to let it finish", row, len(ids))
    return results
