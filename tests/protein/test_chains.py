"""The shipped ProMod3 chains, their split, features and batches."""

import pytest
import torch

from protein.data import CropConfig, FoldingExamples, collate_folding, load_chains, sequence_split
from protein.features import MSA_FEATURES, msa_features, relative_positions
from protein.residues import normalize_sequence, sequence_ids


@pytest.fixture(scope="module")
def chains():
    return load_chains()


def test_shipped_chains_are_real_backbones_split_without_shared_sequences(chains):
    assert len(chains) == 2000 and all(30 <= len(c.sequence) <= 256 for c in chains)
    splits = {name: [c for c in chains if sequence_split(c.sequence) == name] for name in ("train", "validation", "test")}
    assert len(splits["train"]) > 1700 and min(len(splits["validation"]), len(splits["test"])) > 80
    sequences = {name: {c.sequence for c in members} for name, members in splits.items()}
    assert not sequences["train"] & sequences["validation"] and not sequences["train"] & sequences["test"]
    assert not sequences["validation"] & sequences["test"]
    assert [c.name for c in load_chains("test")] == [c.name for c in splits["test"]]
    n_ca = torch.cat([(c.coordinates[:, 0] - c.coordinates[:, 1]).norm(dim=-1) for c in chains])
    assert (n_ca - 1.46).abs().median() < 0.01  # float16 keeps the 1.46 Å bond (a few deposited ones are off)
    for chain in chains[:50]:
        ca = chain.coordinates[:, 1]
        steps = (ca[1:] - ca[:-1]).norm(dim=-1)
        assert ((steps > 2.6) & (steps < 4.2)).all()  # consecutive Cα 3.8 Å apart (cis peptides 2.8 Å)
        assert torch.allclose(chain.profile.sum(-1), torch.ones(len(chain.sequence)), atol=0.03)
        assert len(chain.dssp) == len(chain.sequence) and set(chain.dssp) <= set("HGIEBTSC ")


def test_msa_rows_follow_the_profile_and_withholding_leaves_the_query():
    residues = sequence_ids("ACDW" * 50)
    profile = torch.zeros(200, 20)
    profile[:, 5] = 1.0  # every column all glycine
    msa, mask = msa_features(residues, profile, rows=6, generator=torch.Generator().manual_seed(0))
    assert msa.shape == (6, 200, MSA_FEATURES) and mask.shape == (6, 200)
    assert torch.equal(msa[0, :, :21].argmax(-1), residues) and (msa[1:, :, 5] == 1).all()
    alone, alone_mask = msa_features(residues, None, rows=6)
    assert alone.shape == (1, 200, MSA_FEATURES) and (alone[..., 21:] == 0).all()
    with pytest.raises(ValueError, match=r"profile must be \(L, 20\)"):
        msa_features(residues, torch.zeros(10, 20), rows=2)
    classes = relative_positions(torch.tensor([0, 1, 2, 50]), clip=32)
    assert classes[0].tolist() == [32, 33, 34, 64] and classes[3, 0].item() == 0


def test_sequences_are_read_with_unknowns_and_bad_letters_named():
    assert normalize_sequence("acdBzX") == "ACDXXX"
    assert sequence_ids("AY").tolist() == [0, 19]
    with pytest.raises(ValueError, match="sequence has '\\*' at position 3"):
        normalize_sequence("ACD*")


def test_crops_and_batches(chains):
    config = CropConfig(crop_size=40, msa_rows=4, withhold_profile=0.5)
    examples = FoldingExamples(chains[:8], config)
    torch.manual_seed(0)
    items = [examples[i] for i in range(8)]
    assert [i["input_ids"].shape[0] for i in items] == [min(40, len(c.sequence)) for c in chains[:8]]
    assert {i["msa_features"].shape[0] for i in items} == {1, 4}  # some profiles withheld
    start = int(items[0]["position_ids"][0])
    assert torch.equal(items[0]["coordinates"], chains[0].coordinates[start : start + 40])
    batch = collate_folding(items[:3])
    longest = max(i["input_ids"].shape[0] for i in items[:3])
    assert batch["msa_features"].shape[:3] == (3, max(i["msa_features"].shape[0] for i in items[:3]), longest)
    assert batch["attention_mask"].sum(1).tolist() == [i["input_ids"].shape[0] for i in items[:3]]
    fixed = FoldingExamples(chains[:2], config, random=False, with_profile=False)
    assert fixed[0]["msa_features"].shape[0] == 1 and torch.equal(fixed[1]["msa_features"], fixed[1]["msa_features"])
    with pytest.raises(ValueError, match="crop_size >= 8"):
        CropConfig(crop_size=4)
