"""Frames, invariant point attention and FAPE: exactness of the geometry and invariance under global
rotations and translations (float64)."""

import pytest
import torch

from protein.frames import IDEAL_BACKBONE, Frames, quaternion_update
from protein.losses import fape
from protein.pdb_io import read_chain
from protein.structure_module import InvariantPointAttention, StructureConfig, StructureModule

from geometry import random_rotation


def random_frames(shape, seed) -> Frames:
    g = torch.Generator().manual_seed(seed)
    update = torch.randn(*shape, 6, dtype=torch.float64, generator=g) * torch.tensor([1, 1, 1, 5, 5, 5.0], dtype=torch.float64)
    return quaternion_update(update)


def moved(frames: Frames, rotation, shift) -> Frames:
    """Every frame carried by the same global motion x -> R x + t."""
    return Frames(rotation @ frames.rotation, frames.translation @ rotation.T + shift)


def test_quaternion_updates_are_rotations_and_compose():
    frames = random_frames((7,), 0)
    identity = torch.eye(3, dtype=torch.float64).expand(7, 3, 3)
    assert torch.allclose(frames.rotation @ frames.rotation.transpose(-1, -2), identity, atol=1e-12)
    assert torch.allclose(torch.linalg.det(frames.rotation), torch.ones(7, dtype=torch.float64))
    other = random_frames((7,), 1)
    points = torch.randn(7, 3, dtype=torch.float64)
    assert torch.allclose(frames.compose(other).apply(points), frames.apply(other.apply(points)))
    assert torch.allclose(frames.invert_apply(frames.apply(points)), points)


def test_frames_from_backbone_place_the_backbone_back(nmr_ensemble):
    chain = read_chain(nmr_ensemble)
    n, ca, c = chain.coordinates[:, 0].double(), chain.coordinates[:, 1].double(), chain.coordinates[:, 2].double()
    frames = Frames.from_points(n, ca, c)
    local_n, local_c = frames.invert_apply(n), frames.invert_apply(c)
    assert torch.allclose(local_n[:, 2], torch.zeros(71, dtype=torch.float64), atol=1e-6)  # N in the xy-plane
    assert (local_n[:, 1] > 0).all() and torch.allclose(local_c[:, 1:], torch.zeros(71, 2, dtype=torch.float64), atol=1e-6)
    placed = frames.backbone()  # ideal geometry: within 0.1 Å of the deposited N and C
    assert (placed[:, 1] - ca).norm(dim=-1).max() < 1e-6
    assert (placed[:, 0] - n).norm(dim=-1).max() < 0.1 and (placed[:, 2] - c).norm(dim=-1).max() < 0.1
    assert IDEAL_BACKBONE.shape == (3, 3)


def test_invariant_point_attention_is_invariant_to_global_motions():
    torch.manual_seed(0)
    ipa = InvariantPointAttention(StructureConfig(single_dim=16, heads=2, head_dim=4), pair_dim=8).double()
    for p in ipa.parameters():
        p.data.normal_(0, 0.5)
    single, pair = torch.randn(2, 9, 16, dtype=torch.float64), torch.randn(2, 9, 9, 8, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.float64)
    mask[1, 6:] = 0
    frames = random_frames((2, 9), 2)
    out = ipa(single, pair, frames, mask)
    rotation, shift = random_rotation(3), torch.tensor([4.0, -2.0, 9.0], dtype=torch.float64)
    assert torch.allclose(ipa(single, pair, moved(frames, rotation, shift), mask), out, atol=1e-10)
    assert out.abs().max() > 1e-3  # the check is not vacuous


def test_chunked_invariant_point_attention_and_fape_equal_unchunked_with_gradients():
    torch.manual_seed(1)
    ipa = InvariantPointAttention(StructureConfig(single_dim=16, heads=2, head_dim=4), pair_dim=8).double()
    for p in ipa.parameters():
        p.data.normal_(0, 0.5)
    norm = torch.nn.LayerNorm(8).double()
    single, pair = torch.randn(2, 9, 16, dtype=torch.float64), torch.randn(2, 9, 9, 8, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.float64)
    mask[1, 6:] = 0
    frames, true = random_frames((2, 9), 3), random_frames((2, 9), 4)
    results = []
    for chunk in (None, 2):  # chunked: each chunk normalises its own rows of the pair
        ipa.zero_grad()
        leaves = [t.clone().requires_grad_() for t in (single, pair, frames.translation)]
        moved_frames = Frames(frames.rotation, leaves[2])
        out = (ipa(leaves[0], leaves[1], moved_frames, mask, chunk, norm) if chunk else
               ipa(leaves[0], norm(leaves[1]), moved_frames, mask))
        loss = (out**2).sum() + fape(moved_frames, true, leaves[2], true.translation, mask, mask, chunk_size=chunk)
        loss.backward()
        results.append([loss.detach()] + [t.grad for t in leaves] + [p.grad.clone() for p in ipa.parameters()])
    for whole, chunked in zip(*results):
        assert torch.allclose(chunked, whole, rtol=1e-10, atol=1e-12)
    assert results[0][3].abs().max() > 1e-3  # FAPE and IPA reach the translations


def test_fape_is_zero_for_the_truth_invariant_and_clamped():
    true, pred = random_frames((1, 12), 4), random_frames((1, 12), 5)
    mask = torch.ones(1, 12, dtype=torch.float64)
    value = fape(pred, true, pred.translation, true.translation, mask, mask)
    assert fape(true, true, true.translation, true.translation, mask, mask).item() == pytest.approx(1e-3)  # sqrt(eps) / scale
    rotation, shift = random_rotation(6), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    carried = moved(pred, rotation, shift)
    assert fape(carried, true, carried.translation, true.translation, mask, mask).item() == pytest.approx(value.item(), rel=1e-12)
    unclamped = fape(pred, true, pred.translation, true.translation, mask, mask, clamp=None)
    assert value.item() <= 1.0 + 1e-12 and unclamped > value


def test_structure_module_outputs_in_float32_under_bf16_autocast():
    module = StructureModule(StructureConfig(single_dim=16, heads=2, head_dim=4, layers=2), single_in=8, pair_dim=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(torch.randn(1, 6, 8), torch.randn(1, 6, 6, 8), torch.ones(1, 6))
    assert out["backbone"].dtype == torch.float32 and len(out["frames"]) == 2
    n_ca = (out["backbone"][..., 0, :] - out["backbone"][..., 1, :]).norm(dim=-1)
    assert torch.allclose(n_ca, torch.full_like(n_ca, IDEAL_BACKBONE[0].norm().item()), atol=1e-5)
