"""Tensor and sequence parallelism on real gloo ranks against one process: fp32, same data and seed,
3 AdamW steps at lr 1e-3 (which does not amplify summation-order noise), losses per step and every
parameter after the last step within 1e-5 relative; checkpoints across layouts.

Left out of the parameter comparison, where AdamW turns rounding noise into steps of size lr: the
key projection's bias and the folding model's row-attention pair-norm bias, which shift every
score of a query equally (their gradients are zero up to rounding), and the structure module's
zero-initialised backbone-update bias, whose gradients start near 1e-9, AdamW's eps (the gradients
themselves agree: every gradient on a probe batch before training is compared too, all but the two
whose value is zero up to rounding).
"""

import pytest
import torch


ONE = ("gpt/1/0/0", "mqa/1/0/0", "moe/1/0/0", "custom/1/0/0", "gained/1/0/0", "bert/1/0/0", "vit/1/0/0", "conformer/1/0/0", "whisper/1/0/0", "fold/1/0/0",
       "fold_dropout/1/0/0", "translator/1/0/0", "marian/1/0/0")
TWO = ("gpt/2/0/0", "gpt/2/0/1", "mqa/2/0/0", "moe/2/0/1", "gained/2/0/0", "bert/2/0/1", "fold/2/0/0", "fold_dropout/2/0/0",
       "translator/2/0/1", "translator/1/3/0", "marian/2/0/1")
FOUR = ("gpt/2/3/0", "gpt/2/3/1/compiled", "gpt/2/2/1", "custom/2/1/0", "custom/2/3/0", "bert/2/3/0", "vit/2/1/0", "conformer/2/2/0",
        "whisper/2/3/0", "translator/2/3/1")
"""model/tp/zero/sequence_parallel[/compiled] (models: tests/tiny_models.py TP_MODELS): on 2 ranks
dp=1 x tp=2, on 4 ranks dp=2 x tp=2; "compiled" compiles the blocks (Strategy.compile="blocks",
Inductor) against the eager one-process run."""


ZERO_GRADIENT = ("attn.k.bias", "row_attention.pair_norm.bias")
AMPLIFIED = (*ZERO_GRADIENT, "backbone_update.bias")


WORKER_RUNS = [(4, "tensor_parallel", "{out}/tp-4.pt", *FOUR), (4, "tp_save", "{out}/tp"),
               (4, "tp_activations", "{out}/tp-activations4.pt"),
               (2, "tensor_parallel", "{out}/tp-2.pt", *TWO), (2, "tp_resume", "{out}/tp", "2", "0", "{out}/tp-resumed_tp2.pt"),
               (2, "tp_checks", "{out}/tp-checks.pt"), (2, "tp_activations", "{out}/tp-activations2.pt"),
               (1, "tensor_parallel", "{out}/tp-1.pt", *ONE), (1, "tp_resume", "{out}/tp", "1", "0", "{out}/tp-resumed_one.pt"),
               (1, "tp_activations", "{out}/tp-activations1.pt")]
"""Every scenario of this module (conftest.py runs 4 ranks first: their checkpoint is resumed on 2
ranks and in one process): the parity layouts; the dp=2 x tp=2 checkpoint and its resumes; the
saved activations of a block; the regions' draws and bad inputs on 2 ranks."""


@pytest.fixture(scope="module")
def runs(worker_runs):
    return {layout: result for nproc in (1, 2, 4) for layout, result in torch.load(worker_runs / f"tp-{nproc}.pt").items()}


def worst_parameter_error(params: dict, reference: dict) -> tuple[float, str]:
    errors = {name: ((params[name].double() - value.double()).norm() / value.double().norm().clamp(min=1e-30)).item()
              for name, value in reference.items() if not name.endswith(AMPLIFIED) and value.any()}
    name = max(errors, key=errors.get)
    return errors[name], name


@pytest.mark.parametrize("layout", TWO + FOUR)
def test_tensor_parallel_matches_one_process(runs, layout):
    model = layout.split("/")[0]
    result, reference = runs[layout], runs[f"{model}/1/0/0"]
    assert len(result["losses"]) == 3
    assert (result["compiled_calls"] > 0) == layout.endswith("/compiled")
    for ours, theirs in zip(result["losses"], reference["losses"]):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    assert result["params"].keys() == reference["params"].keys()
    error, name = worst_parameter_error(result["params"], reference["params"])
    assert error < 1e-5, name
    for name, grad in reference["grads"].items():
        if grad.any() and not name.endswith(ZERO_GRADIENT):
            error = ((result["grads"][name].double() - grad.double()).norm() / grad.double().norm()).item()
            assert error < 1e-5, name


@pytest.fixture(scope="module")
def checkpoint_runs(worker_runs):
    return tuple(torch.load(worker_runs / name) for name in ("tp/run.pt", "tp-resumed_tp2.pt", "tp-resumed_one.pt"))


def test_checkpoint_of_dp2_tp2_zero3_loads_in_one_process_exactly(checkpoint_runs):
    saved, _, one = checkpoint_runs
    # The step-2 checkpoint, loaded whole into one plain process, then trained to step 4 there.
    assert len(one["losses"]) == 2
    for ours, theirs in zip(one["losses"], saved["losses"][2:]):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    error, name = worst_parameter_error(one["params"], saved["params"])
    assert error < 1e-5, name


def test_checkpoint_of_dp2_tp2_resumes_at_tp2_and_continues_the_loss_curve(checkpoint_runs):
    saved, resumed, one = checkpoint_runs
    for name, value in one["loaded"].items():  # the same step-2 weights whatever the loading layout
        assert torch.equal(resumed["loaded"][name], value), name
    for ours, theirs in zip(resumed["losses"], saved["losses"][2:]):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    error, name = worst_parameter_error(resumed["params"], saved["params"])
    assert error < 1e-5, name


def test_regions_draw_from_each_ranks_stream_bad_lengths_are_refused_and_meta_models_materialise(worker_runs):
    result = torch.load(worker_runs / "tp-checks.pt")
    first, second = result["draws"]
    assert torch.equal(first["before"], second["before"]) and torch.equal(first["after"], second["after"])
    assert not torch.equal(first["inside"], second["inside"])
    assert "sequence length must be divisible by it, got 15" in result["error"]
    assert ("axial parallelism over tp=2 ranks splits the inputs of Evoformer along dim 1 of a (2, 15, 15, 16) "
            "tensor, which must be divisible by 2") in result["axial_error"]
    # A GPT built on the meta device: q's 32 x 32 weight is 16 rows a tensor-parallel rank, initialised
    # by its init_weights (N(0, 0.02)) after sharding, and it trains.
    meta = result["meta"]
    assert meta["local_shape"] == (16, 32) and 0.015 < meta["std"] < 0.025 and 3.0 < meta["loss"] < 5.0
    # The vocabulary-parallel fused cross-entropy (uneven split, bias, label smoothing, ignored
    # labels, several chunks) against float64 over the whole logits, on rank 0.
    assert max(result["vocab_parallel"].values()) < 1e-5, result["vocab_parallel"]


def test_saved_activations_per_rank_follow_the_block_formula(worker_runs):
    """GPT's pre-LN block keeps, per token in fp32: both norm outputs and their rstd (2W + 2), whole
    on every rank under tp alone; q, k, v, the attention output, its log-sum-exp and fc1's output
    (4W + F + a), split over tp; with sequence parallelism all of it split (the regions' gathered
    inputs are given back between forward and backward). Width 32, F = 128, 4 heads, 32 tokens."""
    saved = {nproc: torch.load(worker_runs / f"tp-activations{nproc}.pt") for nproc in (1, 2, 4)}
    tokens, whole, split = 32, 2 * 32 + 2, 4 * 32 + 128 + 4
    assert saved[1][False] == 4 * tokens * (whole + split)
    for tp in (2, 4):
        assert saved[tp][False] == 4 * tokens * (whole + split // tp)
        assert saved[tp][True] == 4 * tokens * (whole + split) // tp
