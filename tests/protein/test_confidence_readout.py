"""The realised fold's confidence readout (protein.confidence_readout): its features against a
pair-by-pair float64 reference, the ridge fit, the model that carries it through a checkpoint and
`fold`, and the command that fits it (protein.fit_confidence) on chains nothing else reads."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import zoo
from protein.burial import BURIAL_TARGETS
from protein.confidence import distogram_lddt
from protein.confidence_readout import (CONTACT_SEPARATION, DISTANCE_GROUPS, FAR, FEATURES, ConfidenceReadout,
                                        readout_features)
from protein.data import CHAINS_FILE, load_chains
from protein.fit_confidence import SCORED_CHAINS, benchmark_chains, fitting_chains, with_card_line
from protein.folding import fold
from protein.losses import distogram_bin_bounds, distogram_bin_centres
from protein.model import FoldingModel
from protein.pair_confidence import RESIDUE_FEATURES
from protein.residues import KYTE_DOOLITTLE
from tests.protein.test_fold_evaluation import TINY
from zoo.parity import relative_error

BINS = 64
LENGTH = 15
SEQUENCE = "MKTAYIAKQRQISFX"


def reference_features(logits: torch.Tensor, ca: torch.Tensor, module_plddt: torch.Tensor, burial: torch.Tensor,
                       pairs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Features of FEATURES' docstring, residue by residue and pair by pair in float64."""
    probabilities = logits.double().softmax(-1)
    bounds = distogram_bin_bounds(BINS).tolist()
    centres = distogram_bin_centres(BINS).double()
    distances = torch.cdist(ca.double(), ca.double())
    width = BINS // DISTANCE_GROUPS

    def below(i: int, j: int, x: float) -> float:
        return sum(probabilities[i, j, k].item() * min(1.0, max(0.0, (x - bounds[k]) / (bounds[k + 1] - bounds[k])))
                   for k in range(BINS))

    out: dict[str, list[float]] = {name: [] for name in FEATURES}
    for i in range(LENGTH):
        others = [j for j in range(LENGTH) if j != i]
        distant = [j for j in others if abs(i - j) >= FAR]
        near = {j: below(i, j, 15.0) for j in others}
        out["expected_neighbours"].append(sum(near.values()))
        out["expected_distant_neighbours"].append(sum(near[j] for j in distant))
        out["realised_neighbours_15"].append(sum(distances[i, j].item() < 15 for j in others))
        out["realised_neighbours_10"].append(sum(distances[i, j].item() < 10 for j in others))
        out["realised_distant_neighbours_15"].append(sum(distances[i, j].item() < 15 for j in distant))
        entropy = {j: -sum(p * math.log(p) for p in probabilities[i, j].tolist() if p > 0) for j in others}
        out["entropy"].append(sum(near[j] * entropy[j] for j in others) / sum(near.values()))
        strain = {j: abs(distances[i, j].item() - (probabilities[i, j] @ centres).item()) for j in others}
        out["strain"].append(sum(near[j] * strain[j] for j in others) / sum(near.values()))
        out["log_end_distance"].append(math.log(1 + min(i, LENGTH - 1 - i)))
        out["log_length"].append(math.log(LENGTH))
        out["hydrophobicity"].append(KYTE_DOOLITTLE.get(SEQUENCE[i], 0.0))
        out["module_plddt"].append(module_plddt[i].item())
        for g in range(DISTANCE_GROUPS):
            out[f"predicted_distant_group_{g}"].append(
                sum(probabilities[i, j, g * width : (g + 1) * width].sum().item() for j in distant) / len(distant))
            low, high = (bounds[g * width] if g else -math.inf), (bounds[(g + 1) * width] if g < DISTANCE_GROUPS - 1
                                                                 else math.inf)
            out[f"realised_distant_group_{g}"].append(
                sum(low <= distances[i, j].item() < high for j in distant) / len(distant))
        for cutoff in (8, 12):
            out[f"long_range_contacts_{cutoff}"].append(
                sum(below(i, j, cutoff) for j in others if abs(i - j) >= CONTACT_SEPARATION))
        for k, name in enumerate(BURIAL_TARGETS):
            out[f"predicted_{name}"].append(burial[i, k].item())
        for k, name in enumerate(RESIDUE_FEATURES):
            out[name].append(pairs[i, k].item())
    return {name: torch.tensor(values, dtype=torch.float64) for name, values in out.items() if values}


def test_features_match_the_pair_by_pair_sums_in_float64():
    generator = torch.Generator().manual_seed(1)
    ca = torch.randn(LENGTH, 3, generator=generator, dtype=torch.float64) * 7.0  # distances of ~2 to ~30 Å
    logits = torch.randn(LENGTH, LENGTH, BINS, generator=generator) * 3.0
    module_plddt = torch.rand(LENGTH, generator=generator)
    burial = torch.rand(LENGTH, len(BURIAL_TARGETS), generator=generator) * 4
    pairs = torch.rand(LENGTH, len(RESIDUE_FEATURES), generator=generator)
    ours = readout_features(logits, ca, SEQUENCE, module_plddt, burial, pairs)
    assert ours.shape == (LENGTH, len(FEATURES)) and ours.dtype == torch.float32
    assert torch.equal(ours, readout_features(logits, ca, SEQUENCE, module_plddt, burial, pairs, rows=4))
    assert torch.equal(ours[:, 0], distogram_lddt(logits, ca))
    reference = reference_features(logits, ca, module_plddt, burial, pairs)
    assert len(reference) == len(FEATURES) - 3  # the three distogram_lddt readings are protein.confidence's
    for name, expected in reference.items():
        assert relative_error(ours[:, FEATURES.index(name)], expected) < 1e-5, name
    assert ours[:, FEATURES.index("realised_neighbours_15")].sum() > 0  # the reference is not all zeros
    assert ours[:, FEATURES.index("long_range_contacts_8")].max() > 0.1


def test_bad_input_is_refused():
    burial, pairs = torch.zeros(4, len(BURIAL_TARGETS)), torch.zeros(4, len(RESIDUE_FEATURES))
    with pytest.raises(ValueError, match=r"readout_features needs .* got \(4, 4, 64\), \(5, 3\), 4 letters, \(4,\), \(4, 4\), \(4, 3\)"):
        readout_features(torch.zeros(4, 4, BINS), torch.zeros(5, 3), "MKTA", torch.zeros(4), burial, pairs)
    with pytest.raises(ValueError, match=r"readout_features needs .* got \(4, 4, 64\), \(4, 3\), 4 letters, \(4,\), \(4, 3\), \(4, 3\)"):
        readout_features(torch.zeros(4, 4, BINS), torch.zeros(4, 3), "MKTA", torch.zeros(4), burial[:, :3], pairs)
    with pytest.raises(ValueError, match=r"readout_features needs .* and pairs \(L, 3\); got .*, \(4, 4\), \(4, 2\)"):
        readout_features(torch.zeros(4, 4, BINS), torch.zeros(4, 3), "MKTA", torch.zeros(4), burial, pairs[:, :2])
    with pytest.raises(ValueError, match="the distogram's 60 bins do not split into 8 groups"):
        readout_features(torch.zeros(4, 4, 60), torch.zeros(4, 3), "MKTA", torch.zeros(4), burial, pairs)
    readout = ConfidenceReadout()
    with pytest.raises(ValueError, match=r"features must have 39 columns \(FEATURES\); got \(3, 5\)"):
        readout(torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"fit needs features \(N, 39\) and targets \(N,\); got \(80, 39\) and \(79,\)"):
        readout.fit(torch.zeros(80, 39), torch.zeros(79))
    with pytest.raises(ValueError, match="fit needs at least 78 residues; got 10"):
        readout.fit(torch.zeros(10, 39), torch.zeros(10))


def test_the_fit_recovers_a_linear_target_and_ignores_a_constant_feature():
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(4000, len(FEATURES), generator=generator) * torch.linspace(0.5, 20, len(FEATURES)) + 3.0
    features[:, 5] = 7.0
    truth = torch.zeros(len(FEATURES))
    truth[[0, 3, 17]] = torch.tensor([0.1, -0.004, 0.0015])
    targets = 0.5 + (features - features.mean(0)) @ truth  # within [0, 1]: no clamping
    readout = ConfidenceReadout()
    unfitted = readout(features)
    assert torch.equal(unfitted, features[:, 0].clamp(0, 1))
    readout.fit(features, targets)
    assert readout.weight[5] == 0 and readout.scale[5] == 1
    assert relative_error(readout(features) - 0.5, targets - 0.5) < 0.01  # the ridge shrinks the weights a little


def test_a_fitted_readout_survives_the_checkpoint_and_gives_folds_their_plddt(tmp_path):
    torch.manual_seed(0)
    model = FoldingModel(TINY).eval()
    readout_parameters = [p for name, p in model.named_parameters() if name.startswith("confidence_readout.")]
    assert readout_parameters and not any(p.requires_grad for p in readout_parameters)  # the per-pair network, frozen
    sequence = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"
    unfitted = fold(model, sequence)
    features = unfitted.confidence_features
    assert features.shape == (len(sequence), len(FEATURES))
    assert torch.equal(unfitted.plddt, features[:, 0].clamp(0, 1))
    model.confidence_readout.fit(features.repeat(3, 1), torch.linspace(0.2, 0.8, 3 * len(sequence)))
    zoo.save(model, tmp_path / "fitted", card="# fitted\n")
    loaded = zoo.load(tmp_path / "fitted")
    assert all(torch.equal(loaded.confidence_readout.state_dict()[k], v)
               for k, v in model.confidence_readout.state_dict().items())
    fitted = fold(loaded, sequence)
    assert torch.equal(fitted.confidence_features, features)
    burial = FEATURES.index(f"predicted_{BURIAL_TARGETS[0]}")
    assert torch.equal(features[:, burial : burial + len(BURIAL_TARGETS)], model.burial.predict(sequence))
    logits = fold(model, sequence, keep_logits=True).distogram_logits
    assert torch.equal(features[:, -len(RESIDUE_FEATURES):], model.confidence_readout.pairs.residue_features(
        logits, fitted.backbone[:, 1], model.burial.predict(sequence)))
    assert torch.equal(fitted.plddt, model.confidence_readout(features)) and not torch.equal(fitted.plddt, unfitted.plddt)
    assert fold(loaded, sequence, realisation=None).confidence_features is None


def test_the_fitting_chains_are_neither_scored_nor_benchmarked():
    validation = load_chains("validation")
    chains = fitting_chains(CHAINS_FILE, 1000)
    read = {c.sequence for c in benchmark_chains()} | {c.sequence for c in validation[:SCORED_CHAINS]}
    assert len(chains) == len(validation[SCORED_CHAINS:][1::2]) > 20  # the odd ones past the scored
    assert not read & {c.sequence for c in chains}
    assert [c.name for c in fitting_chains(CHAINS_FILE, 5, skip=0)] == [c.name for c in validation[1:10:2]]
    with pytest.raises(ValueError, match="count must be >= 1; got 0"):
        fitting_chains(CHAINS_FILE, 0)
    with pytest.raises(ValueError, match="no validation chain of .* is left to fit on past the first 1000"):
        fitting_chains(CHAINS_FILE, 5, skip=1000)


def test_the_card_line_follows_how_the_model_was_made_and_replaces_an_earlier_one():
    card = "# m\n\nIntro.\n\n- Made by: x\n  more\n- Fit: y\n\n| a |\n|---|\n\n## Memory\n\ntable\n"
    once = with_card_line(card, "- Confidence readout fitted on 3 chains")
    assert once == ("# m\n\nIntro.\n\n- Made by: x\n  more\n- Confidence readout fitted on 3 chains\n- Fit: y\n\n"
                    "| a |\n|---|\n\n## Memory\n\ntable\n")
    assert with_card_line(once, "- Confidence readout fitted on 4 chains") == once.replace("3 chains", "4 chains")
    assert with_card_line("# m\n\nIntro.\n\n## Memory\n", "- Confidence readout fitted") == \
        "# m\n\nIntro.\n- Confidence readout fitted\n\n## Memory\n"
    assert with_card_line("# m\n", "- Confidence readout fitted") == "# m\n- Confidence readout fitted\n"


@pytest.mark.timeout(300)
def test_the_command_fits_a_saved_model_and_keeps_its_other_files(tmp_path):
    torch.manual_seed(0)
    model = FoldingModel(TINY)
    card = "# tiny\n\n- Made by: a test\n\n## Memory\n\nnone\n"
    zoo.save(model, tmp_path / "tiny", card=card, extra={"metrics": {"steps": 3}}, files={"train.log": b"step 1\n"})
    folds = tmp_path / "folds"

    def fit(*arguments: str) -> None:
        result = subprocess.run([sys.executable, "-m", "protein.fit_confidence", str(tmp_path / "tiny"), "--chains", "2",
                                 "--threads", "1", "--folds", str(folds), *arguments], capture_output=True, text=True,
                                timeout=90, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-3000:]

    fit("--burial-epochs", "1")
    burial = f"burial network (`protein.burial`) trained on {len(load_chains('train')):,} training chains for 1 epoch,"
    assert burial in (tmp_path / "tiny" / "README.md").read_text()
    fitted = zoo.load(tmp_path / "tiny")
    assert not torch.equal(fitted.confidence_readout.weight, model.confidence_readout.weight)
    assert not torch.equal(fitted.confidence_readout.pairs.net[0].weight, model.confidence_readout.pairs.net[0].weight)
    assert not torch.equal(fitted.burial.out.weight, model.burial.out.weight)
    kept = {path.name: path.stat().st_mtime_ns for path in folds.iterdir()}
    assert sorted(kept) == sorted(f"{chain.name}.pt" for chain in fitting_chains(CHAINS_FILE, 2))
    fit("--burial-epochs", "0")  # the same model: its folds are read back, and the same fit comes out
    assert {path.name: path.stat().st_mtime_ns for path in folds.iterdir()} == kept
    refitted = zoo.load(tmp_path / "tiny")
    assert all(torch.equal(value, fitted.state_dict()[name]) for name, value in refitted.state_dict().items())
    assert all(torch.equal(value, model.state_dict()[name]) for name, value in fitted.state_dict().items()
               if not name.startswith(("burial.", "confidence_readout.")))
    assert (tmp_path / "tiny" / "train.log").read_bytes() == b"step 1\n"
    assert zoo.store.read_config(tmp_path / "tiny")["metrics"] == {"steps": 3}
    text = (tmp_path / "tiny" / "README.md").read_text()
    chains = fitting_chains(CHAINS_FILE, 2)
    assert (f"- Confidence readout fitted (`protein.confidence_readout`) on realised folds of 2 validation chains "
            f"({sum(len(c.sequence) for c in chains):,} residues)") in text
    assert (f"`python -m protein.fit_confidence {tmp_path / 'tiny'} --chains-file {CHAINS_FILE.name} --burial-epochs 0 "
            f"--chains 2 --check-every 4`") in text
    assert "the per-pair network (`protein.pair_confidence`) it reads trained first on 12,000 pairs" in text
    assert "; fitted first without 1 of the chains, it scored those at Pearson r " in text
    assert "; the burial network (`protein.burial`) is the model's own, kept from an earlier fit." in text
    assert burial not in text
    assert text.count("- Confidence readout fitted") == 1
    assert text.index("- Made by: a test") < text.index("Confidence readout") < text.index("## Memory")
    other = FoldingModel(TINY)  # another trunk: the kept folds are not its own, so it folds anew
    zoo.save(other, tmp_path / "tiny", card=card)
    fit("--burial-epochs", "0")
    assert all(path.stat().st_mtime_ns > kept[path.name] for path in folds.iterdir())
    assert not torch.equal(zoo.load(tmp_path / "tiny").confidence_readout.weight, fitted.confidence_readout.weight)
