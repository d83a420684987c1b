"""The PyTorch path's counter-based dropout mask: right keep rate, no correlation between
neighbouring elements (within and across 64-bit words) or neighbouring seeds."""

import pytest
import torch

from zoo.nn.attention import _rows_dropped
from zoo.nn.dropout import dropout, keep_mask, random_words, random_words_at

N = 1_000_000
CPU = torch.device("cpu")


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_p(p):
    kept = keep_mask((N,), p, seed=11, device=CPU).double().mean().item()
    assert abs(kept - (1 - p)) < 5 * (p * (1 - p) / N) ** 0.5


@pytest.mark.parametrize("lag", [1, 3, 4, 5, 64])
def test_neighbouring_elements_are_uncorrelated(lag):
    kept = keep_mask((N,), 0.5, seed=5, device=CPU).double() - 0.5
    correlation = 4 * (kept[lag:] * kept[:-lag]).mean().item()
    assert abs(correlation) < 5 / N**0.5


def test_neighbouring_seeds_are_uncorrelated_and_words_cover_all_bits():
    first = keep_mask((N,), 0.5, seed=7, device=CPU).double() - 0.5
    second = keep_mask((N,), 0.5, seed=8, device=CPU).double() - 0.5
    assert abs(4 * (first * second).mean().item()) < 5 / N**0.5
    words = random_words(100_000, seed=0, device=CPU)
    bits = torch.stack([(words >> k) & 1 for k in range(64)]).double().mean(1)  # each bit set half the time
    assert (bits - 0.5).abs().max().item() < 5 * 0.5 / 100_000**0.5


def test_mask_has_the_shape_and_is_a_prefix_of_a_longer_draw():
    mask = keep_mask((3, 5, 7), 0.3, seed=2, device=CPU)
    assert mask.shape == (3, 5, 7) and mask.dtype == torch.bool
    assert torch.equal(mask.flatten(), keep_mask((200,), 0.3, seed=2, device=CPU)[:105])


def test_words_at_offsets_are_those_words_of_the_draw():
    draw = random_words(60, seed=5, device=CPU)
    offsets = torch.arange(60).view(3, 4, 5).permute(2, 0, 1)  # another layout's order
    assert torch.equal(random_words_at(offsets.clone(), seed=5), draw[offsets])


def test_attention_s_dropout_reads_one_mask_in_either_layout():
    """The chunked attention's mask (zoo.nn.attention), hashed in the probabilities' (B, H, rows,
    keys) order or cut from the (rows, B, H, keys) draw, is the same mask."""
    for keys, visible in ((16, 16), (16, 7), (12, 12), (10, 6)):  # 10: words straddle rows, the draw's order
        dropped = _rows_dropped((2, 3, 5, keys), 0.3, 9, 4, visible, CPU)
        drawn = keep_mask((5, 2, 3, keys), 0.3, seed=9, device=CPU, offset=4 * 2 * 3 * keys)
        assert torch.equal(dropped, ~drawn.permute(1, 2, 0, 3)[..., :visible])


def test_shared_dims_share_one_mask_value_and_backward_reuses_it():
    x = torch.randn(6, 5, 40, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x, 0.5, shared_dims=(1,))
    kept = y.detach() != 0
    assert torch.equal(kept, kept[:, :1].expand_as(kept))  # the same along dimension 1
    assert 0.3 < kept[:, 0].float().mean().item() < 0.7
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad != 0, kept) and torch.allclose(x.grad[kept], torch.full_like(x.grad[kept], 2.0))
    with pytest.raises(ValueError, match="shared_dims must be dimensions"):
        dropout(x, 0.5, shared_dims=(3,))


def test_inductor_draws_eager_s_mask_at_any_offset_from_a_seed_tensor():
    """Under torch.compile the seed stays a tensor and the hash is one opaque operator: traced into
    Inductor's C++, its wrapping int64 multiplications drew other bits at offset 8 and corrupted
    memory at offset 2 (signed overflow is undefined there)."""
    def masked(x, seed, offset):
        return x * keep_mask(x.shape, 0.25, seed, x.device, offset=offset)

    x = torch.randn(4, 256)
    for offset in (0, 2, 8, 3 * 2**20 + 2):
        compiled = torch.compile(masked, fullgraph=True, dynamic=False)(x, torch.tensor(1234), offset)
        assert torch.equal(compiled, masked(x, 1234, offset))
        assert 0.2 < (compiled == 0).float().mean() < 0.3
