"""Text data for the language models: the Shakespeare corpus and the human-rated VADER sentiment
snippets (`zoo.corpora`, shared with asr), fixed-length language-modelling examples cut from a token
stream, and padding of variable-length examples into batches."""

from __future__ import annotations

import torch

from zoo.corpora import shakespeare_text
from zoo.downloads import data_dir

class TokenBlocks(torch.utils.data.Dataset):
    """Blocks of a token stream as causal-LM examples in Hugging Face's form (labels = input_ids, the
    model shifts them).

    Example i is {"input_ids": ids[i*(L-1) : i*(L-1)+L], "labels": the same}, both (L,) int64 with
    L = block_size: consecutive blocks share one token, so every token after the first is predicted
    exactly once."""

    def __init__(self, ids: torch.Tensor, block_size: int) -> None:
        if block_size < 2:
            raise ValueError(f"block_size must be >= 2 (a block predicts its tokens after the first); got {block_size}")
        if ids.ndim != 1 or ids.numel() < block_size:
            raise ValueError(f"ids must be a 1-D stream of at least block_size={block_size} tokens; got shape {tuple(ids.shape)}")
        self.ids, self.block_size = ids, block_size

    def __len__(self) -> int:
        return (self.ids.numel() - 1) // (self.block_size - 1)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} blocks")
        start = index * (self.block_size - 1)
        block = self.ids[start : start + self.block_size]
        return {"input_ids": block, "labels": block.clone()}


def pad_sequences(sequences: list[torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """Token id sequences (L_i,) -> input_ids, attention_mask (1 = token) and token_type_ids
    (zeros), each (B, max L_i) int64."""
    length = max(sequence.numel() for sequence in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : sequence.numel()], attention_mask[row, : sequence.numel()] = sequence, 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids)}


def pad_collate(pad_id: int):
    """A collate function for examples {"input_ids": (L_i,) int64, "labels": scalar}: `pad_sequences`
    plus the stacked labels."""

    def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = pad_sequences([e["input_ids"] for e in examples], pad_id)
        batch["labels"] = torch.stack([torch.as_tensor(e["labels"]) for e in examples])
        return batch

    return collate


if __name__ == "__main__":
    corpus = shakespeare_text()
    print(f"{data_dir() / 'shakespeare.txt'}: {len(corpus):,} characters, {len(set(corpus))} distinct")
