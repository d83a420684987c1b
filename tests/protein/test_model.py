"""The folding model: it learns a real chain, keeps activations of the last recycle only,
recompute is bit-exact, chunking and a memory budget change nothing, bf16 stays close, and it
saves and loads through the zoo."""

import copy

import pytest
import torch

import zoo
from protein.data import CropConfig, FoldingExamples, collate_folding, load_chains
from protein.evoformer import EvoformerConfig
from protein.model import FoldConfig, FoldingModel
from protein.structure_module import StructureConfig
from trainers.memory.recompute import RecomputePolicy, apply_recompute, uniform_keep
from trainers.memory.saved_activations import SavedActivations

TINY = FoldConfig(evoformer=EvoformerConfig(msa_dim=16, pair_dim=16, blocks=2, msa_heads=2, pair_heads=2, head_dim=8,
                                            outer_product_dim=4, triangle_dim=16),
                  structure=StructureConfig(single_dim=32, layers=2, heads=2, head_dim=8), max_recycles=1)


@pytest.fixture(scope="module")
def batch():
    chains = load_chains("validation")[:2]
    torch.manual_seed(0)
    examples = FoldingExamples(chains, CropConfig(crop_size=24, msa_rows=4, withhold_profile=0.0))
    return collate_folding([examples[0], examples[1]])


def model(seed: int = 0, **overrides) -> FoldingModel:
    torch.manual_seed(seed)
    return FoldingModel(FoldConfig(**{**TINY.__dict__, **overrides}))


def test_learns_two_real_chains(batch):
    folding = model(secondary_structure_weight=0.0)  # the structure's own losses alone
    optimizer = torch.optim.Adam(folding.parameters(), 3e-3)
    losses = []
    for step in range(40):
        out = folding(**batch, recycles=0)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        losses.append(out["fape"].item())
    assert losses[-1] < 0.75 * losses[0]
    assert out["backbone"].shape == (2, 24, 3, 3) and ((out["plddt"] >= 0) & (out["plddt"] <= 1)).all()


def test_only_the_last_recycle_keeps_activations(batch):
    folding = model().train()
    saved = []
    for recycles in (0, 2):
        torch.manual_seed(1)
        with SavedActivations(exclude=folding.parameters()) as activations:
            folding(**batch, recycles=recycles)
        saved.append(activations.bytes)
    assert saved[0] == saved[1] > 0


def test_recompute_is_bit_identical_in_float32(batch):
    plain = model(seed=2).train()
    recomputed = copy.deepcopy(plain)
    apply_recompute(recomputed, RecomputePolicy(uniform_keep(recomputed.parallel_plan().block_names(recomputed), "blocks")))
    results = []
    for folding in (plain, recomputed):
        torch.manual_seed(3)
        loss = folding(**batch, recycles=1)["loss"]
        loss.backward()
        results.append((loss.detach(), {n.replace("._checkpoint_wrapped_module", ""): p.grad
                                        for n, p in folding.named_parameters() if p.requires_grad}))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(g, results[1][1][n]) for n, g in results[0][1].items())


def test_chunking_and_memory_budget_change_nothing_and_bf16_is_close(batch):
    whole = model(seed=4).eval()
    with torch.no_grad():
        reference = whole(**batch)
        for overrides in ({"chunk_size": 5}, {"memory_budget": 20_000}):
            chunked = model(seed=4, **overrides).eval()
            assert chunked.chunk_size(24, 4, 2) == overrides.get("chunk_size", 20_000 // (2 * 4 * 2 * 24 * 24))
            out = chunked(**batch)
            assert torch.allclose(out["backbone"], reference["backbone"], atol=1e-4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = whole(**batch)
    error = (half["backbone"] - reference["backbone"]).norm() / reference["backbone"].norm()
    assert error < 2e-2


def test_chunked_training_step_has_the_same_loss_and_gradients(batch):
    results = []
    for chunk in (None, 5):  # eval: no dropout; gradients still recorded, so the chunks are checkpointed
        folding = model(seed=6, chunk_size=chunk).eval()
        out = folding(**batch, recycles=1)
        out["loss"].backward()
        results.append((out["loss"].detach(), out["distogram_loss"],
                        {n: p.grad for n, p in folding.named_parameters() if p.requires_grad}))
    (loss, distogram, grads), (chunked_loss, chunked_distogram, chunked_grads) = results
    assert torch.allclose(chunked_loss, loss, rtol=1e-5) and torch.allclose(chunked_distogram, distogram, rtol=1e-5)
    scale = max(g.abs().max() for g in grads.values())
    assert all((chunked_grads[n] - g).abs().max() <= 1e-5 * scale for n, g in grads.items())
    assert grads["distogram_head.weight"].abs().max() > 0


def test_distogram_logits_are_symmetric_and_only_returned_without_labels(batch):
    folding = model(seed=7).eval()
    inputs = {k: v for k, v in batch.items() if k not in ("coordinates", "atom_mask")}
    with torch.no_grad():
        logits = folding(**inputs)["distogram_logits"]
        assert "distogram_logits" not in folding(**batch)
    assert logits.shape == (2, 24, 24, TINY.distogram_bins) and torch.equal(logits, logits.transpose(1, 2))


def test_saves_and_loads_through_the_zoo(batch, tmp_path):
    folding = model(seed=5).eval()
    zoo.save(folding, tmp_path / "fold", card="# test")
    loaded = zoo.load(tmp_path / "fold").eval()
    with torch.no_grad():
        assert torch.equal(loaded(**batch)["backbone"], folding(**batch)["backbone"])


def test_training_recycles_are_drawn_from_the_step_so_ranks_agree(batch):
    folding = model().train()
    passes = []
    folding.evoformer.register_forward_hook(lambda *_: passes.append(1))

    def count(step: int) -> int:
        folding.set_training_step(step)
        passes.clear()
        with torch.no_grad():
            folding(**batch)
        return len(passes)

    counts = [count(step) for step in range(8)]
    assert set(counts) == {1, 2}  # max_recycles = 1: one or two passes
    assert [count(step) for step in range(8)] == counts


def test_the_example_batch_has_the_training_batch_format_and_trains(batch):
    folding = model()
    example = FoldingModel.example_batch(folding.config, 2)
    assert example.keys() == batch.keys()
    assert all(value.dtype == batch[key].dtype and value.ndim == batch[key].ndim for key, value in example.items())
    shapes = {key: tuple(value.shape) for key, value in example.items()}
    features = batch["msa_features"].shape[-1]
    assert shapes == {"input_ids": (2, 256), "position_ids": (2, 256), "attention_mask": (2, 256),
                      "msa_features": (2, 8, 256, features), "msa_mask": (2, 8, 256), "coordinates": (2, 256, 5, 3),
                      "atom_mask": (2, 256, 5), "secondary_structure": (2, 256), "profile": (2, 256, 20)}
    loss = folding(**example, recycles=0)["loss"]
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in folding.parameters() if p.grad is not None)


def test_auxiliary_losses_match_a_float64_reference(batch):
    """Secondary structure over present residues and the profile over residues whose profile the
    input withheld: cross-entropies recomputed in float64 from the heads' logits."""
    chains = load_chains("validation")[:2]
    torch.manual_seed(3)
    examples = FoldingExamples(chains, CropConfig(crop_size=24, msa_rows=4, withhold_profile=0.0))
    withheld = FoldingExamples(chains, CropConfig(crop_size=16, msa_rows=4, withhold_profile=1.0))
    mixed = collate_folding([examples[0], withheld[1]])  # the second crop is shorter: padded, profile withheld
    folding = model(seed=4, secondary_structure_weight=0.7, profile_weight=0.2)
    logits = {}
    for name in ("secondary_structure_head", "profile_head", "plddt_head"):
        getattr(folding, name).register_forward_hook(lambda _m, _i, out, name=name: logits.__setitem__(name, out))
    out = folding(**mixed, recycles=0)
    present = mixed["attention_mask"].bool()
    states = logits["secondary_structure_head"].double()[present].log_softmax(-1)
    expected_states = -states.gather(1, mixed["secondary_structure"][present][:, None]).mean()
    assert (mixed["secondary_structure"][1, 16:] == -100).all() and present[1].sum() == 16
    profile_rows = torch.tensor([False, True])[:, None] & present  # withheld in the second crop only
    log_q = logits["profile_head"].double()[profile_rows].log_softmax(-1)
    expected_profile = -(mixed["profile"].double()[profile_rows] * log_q).sum(-1).mean()
    assert out["secondary_structure_loss"].item() == pytest.approx(expected_states.item(), rel=1e-6)
    assert out["profile_loss"].item() == pytest.approx(expected_profile.item(), rel=1e-6)
    total = out["fape"] + 0.3 * out["distogram_loss"] + 0.01 * out["plddt_loss"] + 0.7 * expected_states.float() \
        + 0.2 * expected_profile.float()
    assert out["loss"].item() == pytest.approx(total.item(), rel=1e-5)
    folding.zero_grad()
    out["loss"].backward()
    assert folding.secondary_structure_head[1].weight.grad.abs().max() > 0 and folding.profile_head[1].weight.grad.abs().max() > 0
    with torch.no_grad():
        folding.eval()
        plain = folding(**{k: v for k, v in mixed.items() if k not in ("coordinates", "atom_mask", "secondary_structure",
                                                                        "profile")})
    assert plain["secondary_structure_logits"].shape == (2, 24, 3) and "profile_loss" not in plain
