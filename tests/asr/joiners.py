"""A small tanh joiner and random encoder/decoder outputs for the loss tests."""

import torch
from torch import nn


class TanhJoiner(nn.Module):
    """logits = out(tanh(enc_proj(enc) + dec_proj(dec))), broadcasting enc and dec."""

    def __init__(self, encoder_dim: int, decoder_dim: int, joiner_dim: int, vocab: int) -> None:
        super().__init__()
        self.enc_proj = nn.Linear(encoder_dim, joiner_dim)
        self.dec_proj = nn.Linear(decoder_dim, joiner_dim)
        self.out = nn.Linear(joiner_dim, vocab)

    def forward(self, enc: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.enc_proj(enc) + self.dec_proj(dec)))


def transducer_batch(seed: int, logit_lengths, target_lengths, frames: int, symbols: int, hidden: int = 8,
                     vocab: int = 7, dtype=torch.float64):
    """encoder_out (B, T, H), decoder_out (B, U+1, H), targets (B, U) without blank 0, lengths."""
    g = torch.Generator().manual_seed(seed)
    batch = len(logit_lengths)
    encoder_out = torch.randn(batch, frames, hidden, generator=g, dtype=dtype).requires_grad_()
    decoder_out = torch.randn(batch, symbols + 1, hidden, generator=g, dtype=dtype).requires_grad_()
    targets = torch.randint(1, vocab, (batch, symbols), generator=g)
    return encoder_out, decoder_out, targets, torch.tensor(logit_lengths), torch.tensor(target_lengths)
