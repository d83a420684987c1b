"""Text generation from a saved zoo language model and its tokenizer."""

from __future__ import annotations

import torch

import zoo
from nlp.tokenizers import tokenizer_from_spec
from zoo.store import read_config


def generate_text(name: str, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                  top_k: int | None = None, top_p: float | None = None, seed: int = 0) -> str:
    """Continue `prompt` with the zoo model `name` (a name or folder); returns prompt + continuation."""
    config = read_config(name)
    if "tokenizer" not in config:
        raise ValueError(f"model {name!r} has no tokenizer in its config.json; it cannot read text")
    tokenizer = tokenizer_from_spec(config["tokenizer"])
    model = zoo.load(name)
    ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("prompt must not be empty")
    out = model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=torch.Generator().manual_seed(seed))
    return tokenizer.decode(out[0].tolist())
