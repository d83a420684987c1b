"""Expert parallelism on real gloo ranks against one process (`Strategy(ep=...)`,
`trainers.parallel.experts`): the mixture-of-experts GPT of TP_MODELS (2 blocks of 4 experts, top 2,
width 32), fp32, the same data and seed, AdamW at lr 1e-3 for 3 steps.

Gradients are compared on a probe batch before training (AdamW's first steps hardly depend on a
gradient's scale, so a wrong mean over ranks would pass the parameters' comparison), then each
step's loss and every parameter after the last, within 1e-5 relative; the routers' choices (each
step's tokens per expert in every layer, summed over the data-parallel replicas) exactly. Memory per rank: each rank's
local elements of the experts' parameters and AdamW moments against the closed form. Traffic: the
all-to-all payload over all ranks against the analytic volume, to the byte.
"""

import pytest
import torch

from trainers import Strategy

FOUR = ("2/3", "4/0", "2/0/2", "2/3/2/1")
TWO = ("2/0", "2/3", "2/3/1/0/blocks")
"""EP/ZERO[/TP[/SP[/RECOMPUTE]]]: on 4 ranks ep=2 x (2 ranks holding the same experts, ZeRO-3 over
them), ep=4 (one expert a rank), and ep=2 x tp=2 (each expert's hidden width split over the
tensor-parallel pair), also ZeRO-3 with sequence parallelism; on 2 ranks ep=2 replicated, ZeRO-3,
and ZeRO-3 with every block recomputed (its all-to-alls run again in backward)."""

WORKER_RUNS = [(4, "experts", "{out}/ep-4.pt", *FOUR), (4, "expert_save", "{out}/ep-checkpoints", "2", "3"),
               (2, "experts", "{out}/ep-2.pt", *TWO), (2, "expert_checks", "{out}/ep-checks.pt"),
               (2, "expert_resume", "{out}/ep-checkpoints", "2", "0", "{out}/ep-resumed-ep2.pt"),
               (2, "expert_resume", "{out}/ep-checkpoints", "1", "3", "{out}/ep-resumed-dp2.pt"),
               (1, "experts", "{out}/ep-1.pt", "1/0"),
               (1, "expert_resume", "{out}/ep-checkpoints", "1", "0", "{out}/ep-resumed-one.pt")]
"""The parity runs; the checkpoint of ep=2 x ZeRO-3 over 2 on 4 ranks, resumed at ep=2 on 2 ranks, at
ep=1 ZeRO-3 on 2 ranks and in one plain process; the errors (conftest.py runs 4 ranks first)."""


@pytest.fixture(scope="module")
def runs(worker_runs):
    found = {(1, "1/0"): torch.load(worker_runs / "ep-1.pt")["1/0"]}
    for world in (2, 4):
        found.update({(world, run): result for run, result in torch.load(worker_runs / f"ep-{world}.pt").items()})
    return found


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours.double() - theirs.double()).norm() / theirs.double().norm()).item()


@pytest.mark.parametrize("world_run", [(4, run) for run in FOUR] + [(2, run) for run in TWO],
                         ids=lambda world_run: f"{world_run[0]}ranks-{world_run[1].replace('/', '_')}")
def test_expert_parallel_training_matches_one_process(runs, world_run):
    result, reference = runs[world_run], runs[1, "1/0"]
    for name, expected in reference["grads"].items():
        if expected.any():
            assert relative_error(result["grads"][name], expected) < 1e-5, name
    assert result["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    for name, expected in reference["params"].items():
        assert relative_error(result["params"][name], expected) < 1e-5, name
    assert torch.equal(result["counts"], reference["counts"])  # the routers chose the same experts
    assert reference["counts"].min() > 0  # every expert of every layer took tokens each step


@pytest.mark.parametrize("world_run", [(4, run) for run in FOUR] + [(2, run) for run in TWO],
                         ids=lambda world_run: f"{world_run[0]}ranks-{world_run[1].replace('/', '_')}")
def test_each_rank_holds_its_share_of_the_experts_and_the_tokens_travel_the_analytic_volume(runs, world_run):
    world, run = world_run
    ep, zero, tp = map(int, (run + "/1").split("/")[:3])
    result, holders = runs[world_run], world // (tp * ep)  # ranks holding the same experts ("edp")
    total = result["expert_elements"]
    params = total // (ep * tp) // (holders if zero == 3 else 1)
    moments = 2 * total // (ep * tp) // (holders if zero >= 1 else 1)
    assert result["expert_elements_by_rank"] == [[params, moments]] * world
    steps, layers, forwards = len(result["losses"]), result["layers"], result["forwards_per_rank"]
    assignments = result["tokens_per_step"] * result["top_k"]
    rows = steps * layers * assignments * result["width"] * 4 * 2 * 2  # fp32, there and back, forward and backward
    weights = steps * layers * assignments * 4 * 2  # the router weights there, their gradients back
    # Under tensor parallelism each of the tp expert-parallel groups of a replica moves its whole rows;
    # a recomputed block's forward exchange (half the rows' and the weights' bytes, and the counts)
    # runs again in backward.
    forward_runs = 2 if run.endswith("/blocks") else 1
    counts = forward_runs * world * forwards * layers * result["experts"] * 8  # int64 counts per expert
    assert result["all_to_all_bytes"] == tp * (rows + weights) * (forward_runs + 1) // 2 + counts
    assert runs[1, "1/0"]["all_to_all_bytes"] == 0


def test_bad_expert_parallel_settings_are_refused(worker_runs):
    errors = torch.load(worker_runs / "ep-checks.pt")
    assert errors == {
        "ep3": "Strategy.ep=3 must divide the data-parallel ranks (world size / (tp * pp) = 2 / (1 * 1) = 2)",
        "experts3": "Strategy.ep=2 must divide the experts of every ModelPlan.experts module; 'blocks.0.mlp.experts' has 3",
        "dense": "Strategy.ep=2 shards routed experts, but GPT declares none (ModelPlan.experts)",
        "hidden63": "Strategy.tp=2 must divide the 63 hidden width of the experts of 'blocks.0.mlp.experts'"}
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=rf"Strategy.ep must be an integer >= 1; got {bad!r}"):
            Strategy(ep=bad)
    with pytest.raises(ValueError, match=r"Strategy.ep=2 runs over data-parallel ranks in memory, without a memory "
                                         r"budget yet; got offload='none', memory_budget=1073741824"):
        Strategy(ep=2, memory_budget="1GiB")


@pytest.mark.parametrize("resumed", ["ep2", "dp2", "one"])
def test_a_checkpoint_saved_at_ep2_resumes_at_ep2_at_ep1_and_in_one_process(worker_runs, resumed):
    saved = torch.load(worker_runs / "ep-checkpoints" / "run.pt")
    run, one = torch.load(worker_runs / f"ep-resumed-{resumed}.pt"), torch.load(worker_runs / "ep-resumed-one.pt")
    for name, value in one["loaded"].items():  # the same step-2 weights whatever the loading layout
        assert torch.equal(run["loaded"][name], value), name
    assert run["losses"] == pytest.approx(saved["losses"][2:], rel=1e-5)
    for name, expected in saved["params"].items():
        assert relative_error(run["params"][name], expected) < 1e-5, name
