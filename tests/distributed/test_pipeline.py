"""Pipeline parallelism on real gloo ranks against one process: fp32, same data and seed, 3 AdamW
steps at lr 1e-3 (which does not amplify summation-order noise); losses, gradient norms and the
evaluation loss per run, and every parameter after the last step, within 1e-5 relative.

GPT (four blocks, its word embedding tied to the head across the first and last stage) runs under
each schedule at pp=2, with a step's micro batches in two pipeline runs, in fp16 with loss
scaling, and with dropout 0.1 (every stage continues the generator state its
predecessor left, so the masks are the unpipelined run's); BERT (masked LM, its decoder tied to the word embedding), ViT, the Conformer
transducer and the transducer on a Whisper encoder (padded utterances of different lengths in each micro batch) and the folding model's
Evoformer trunk under 1F1B at pp=2 (the trunk also under zero-bubble, whose weight pass meets
parameter groups that share graph nodes); GPT under breadth-first and zero-bubble at pp=2 x dp=2 with ZeRO-3, and at
pp=2 x tp=2 (with sequence parallelism too); GPT with experts at pp=2, and at pp=2 x dp=2 with its
experts shared out over the data-parallel ranks (ep=2; ZeRO-3 under zero-bubble); a model written in
the test opts in through its own plan; the translators (pre-norm, its encoder's final norm held with
the encoder's last block; Marian-shaped) at pp=2 under 1F1B, the pre-norm one under zero-bubble too,
both sequences' states in the carry. Checkpoints reshard between pipelined and unpipelined layouts and resume exactly.
"""

import pytest
import torch

from helpers import torchrun
from zoo.parity import relative_error

ONE = ("gpt/1f1b/1/1/0", "gpt/1f1b/1/1/0:fp16", "gpt_dropout/1f1b/1/1/0", "moe/1f1b/1/1/0", "custom/1f1b/1/1/0", "bert/1f1b/1/1/0", "vit/1f1b/1/1/0", "conformer/1f1b/1/1/0",
       "whisper/1f1b/1/1/0", "fold/1f1b/1/1/0", "translator/1f1b/1/1/0", "marian/1f1b/1/1/0")
EVERY_TWO = ("gpt/gpipe/2/1/0", "gpt/1f1b/2/1/0", "gpt/interleaved_1f1b/2/2/0", "gpt/looped_bfs/2/2/0",
             "gpt/zero_bubble/2/1/0", "gpt/1f1b/2/1/0:compiled", "gpt/1f1b/2/1/0:m2", "gpt/zero_bubble/2/1/0:m2",
             "gpt/1f1b/2/1/0:fp16", "gpt_dropout/1f1b/2/1/0", "moe/1f1b/2/1/0", "custom/1f1b/2/1/0", "bert/1f1b/2/1/0",
             "vit/1f1b/2/1/0", "conformer/1f1b/2/1/0", "whisper/1f1b/2/1/0", "fold/1f1b/2/1/0", "fold/zero_bubble/2/1/0",
             "translator/1f1b/2/1/0", "translator/zero_bubble/2/1/0", "marian/1f1b/2/1/0")
EVERY_FOUR = ("gpt/looped_bfs/2/2/3", "gpt_dropout/zero_bubble/2/1/3", "gpt/zero_bubble/2/1/3", "gpt/1f1b/2/1/0/2/0",
              "gpt/interleaved_1f1b/2/2/0/2/1", "custom/zero_bubble/2/1/0/2", "moe/1f1b/2/1/0:ep2",
              "moe/zero_bubble/2/1/3:ep2")
COVERED = ("gpt/1f1b/2/1/0", "gpt/zero_bubble/2/1/0", "gpt/looped_bfs/2/2/0", "gpt/interleaved_1f1b/2/2/0",
           "fold/1f1b/2/1/0", "translator/1f1b/2/1/0", "gpt/zero_bubble/2/1/3")
"""Layouts the suite leaves to `python benchmarks/pipeline_layouts.py` (which runs every one): each
schedule, model and option stays in the suite in another layout (1F1B GPT with options, zero-bubble
GPT in two runs and at ZeRO-3 with dropout, the looped and interleaved schedules on 4 ranks, the
folding trunk and the translator under zero-bubble)."""
TWO = tuple(layout for layout in EVERY_TWO if layout not in COVERED)
FOUR = tuple(layout for layout in EVERY_FOUR if layout not in COVERED)
"""model/schedule/pp/stages_per_rank/zero[/tp/sequence_parallel][:options] (tests/distributed/
pipeline_worker.py): on 4 ranks dp = 4 / (pp * tp); ":m2" runs the step's 4 micro batches as two
pipeline runs of 2 (gradients accumulate across runs), ":fp16" computes in fp16 with loss scaling
(against one fp16 process), ":compiled" compiles the blocks (against the eager process), ":ep2"
shares each stage's experts out over its 2 data-parallel ranks (the mixture-of-experts GPT, whose
auxiliary losses travel with the hidden states)."""


AMPLIFIED = ("attn.k.bias", "row_attention.pair_norm.bias", "backbone_update.bias")
"""Left out of the parameter comparison, as in the tensor-parallel tests: biases whose gradients are
zero up to rounding (a key bias, the row attention's pair-norm bias) or start near 1e-9 (the
structure module's zero-initialised backbone update), which AdamW turns into steps of size lr."""


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every scenario of this module in four launches: the parity layouts on 1, 4 and 2 ranks; a
    one-process checkpoint resumed at pp2 x dp2 ZeRO-3, a pp2 x dp2 one resumed at dp2 ZeRO-1 and in
    one process; GPT built on the meta device at pp=2."""
    folder = tmp_path_factory.mktemp("pp")
    pipelined, plain = folder / "pp_save", folder / "one_save"
    pipelined.mkdir()
    plain.mkdir()
    run = lambda nproc, *args: torchrun(nproc, *args, timeout=400, script="pipeline_worker.py")  # noqa: E731
    run(1, "parity", str(folder / "1.pt"), *ONE, "+", "save", str(plain), "1f1b/1/1/0")
    run(4, "parity", str(folder / "4.pt"), *FOUR, "+", "save", str(pipelined), "looped_bfs/2/2/3",
        "+", "resume", str(plain), "zero_bubble/2/1/3", str(plain / "pp2.pt"))
    run(2, "parity", str(folder / "2.pt"), *TWO, "+", "resume", str(pipelined), "1f1b/1/1/1", str(pipelined / "dp2.pt"),
        "+", "meta", str(folder / "meta.pt"))
    run(1, "resume", str(pipelined), "1f1b/1/1/0", str(pipelined / "one.pt"))
    return folder


@pytest.fixture(scope="module")
def runs(launched):
    return {layout: result for nproc in (1, 2, 4) for layout, result in torch.load(launched / f"{nproc}.pt").items()}


@pytest.mark.parametrize("layout", TWO + FOUR)
def test_pipeline_matches_one_process(runs, layout):
    result = runs[layout]
    reference = runs[f"{layout.split('/')[0]}/1f1b/1/1/0" + (":fp16" if layout.endswith(":fp16") else "")]
    assert len(result["losses"]) == 3
    assert (result["compiled_calls"] > 0) == layout.endswith(":compiled")
    for key in ("losses", "grad_norms"):
        for ours, theirs in zip(result[key], reference[key]):
            assert abs(ours - theirs) <= 1e-5 * abs(theirs), key
    assert abs(result["eval_loss"] - reference["eval_loss"]) <= 1e-5 * reference["eval_loss"]
    assert result["expert_counts"] == reference["expert_counts"]  # the routers chose the same experts
    assert result["params"].keys() == reference["params"].keys()
    # fp16: one process sums the tied embedding's two gradients in fp16, the pipeline in fp32 across
    # its first and last stage.
    tolerance = 1e-4 if layout.endswith(":fp16") else 1e-5
    for name, value in reference["params"].items():
        if not name.endswith(AMPLIFIED) and value.any():
            assert relative_error(result["params"][name], value) < tolerance, name


@pytest.fixture(scope="module")
def checkpoint_runs(launched):
    pipelined, plain = launched / "pp_save", launched / "one_save"
    load = lambda folder, name: torch.load(folder / name)  # noqa: E731
    return {"pp2 x dp2 -> one process": (load(pipelined, "run.pt"), load(pipelined, "one.pt")),
            "pp2 x dp2 -> dp2 ZeRO-1": (load(pipelined, "run.pt"), load(pipelined, "dp2.pt")),
            "one process -> pp2 x dp2 ZeRO-3": (load(plain, "run.pt"), load(plain, "pp2.pt"))}


@pytest.mark.parametrize("move", ["pp2 x dp2 -> one process", "pp2 x dp2 -> dp2 ZeRO-1", "one process -> pp2 x dp2 ZeRO-3"])
def test_checkpoints_reshard_across_pipeline_layouts_and_resume_exactly(checkpoint_runs, move):
    straight, resumed = checkpoint_runs[move]
    assert len(resumed["losses"]) == 2
    for ours, theirs in zip(resumed["losses"], straight["losses"][2:]):
        assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    assert resumed["params"].keys() == straight["params"].keys()
    for name, value in straight["params"].items():
        assert relative_error(resumed["params"][name], value) < 1e-5, name


def test_a_model_built_on_the_meta_device_allocates_only_its_stages(launched):
    first, last = torch.load(launched / "meta.pt")
    # Split by FLOPs counted on meta tensors: the first stage's blocks, then the last's.
    assert first["blocks"] == last["blocks"] and first["blocks"][0] + first["blocks"][1] == [0, 1, 2, 3]
    own = lambda held, stage: {n.split(".")[1] for n in held if n.startswith("blocks.")} == {  # noqa: E731
        str(i) for i in first["blocks"][stage]}
    assert own(first["held"], 0) and own(last["held"], 1)
    assert "embeddings.position.weight" in first["held"] and "embeddings.position.weight" not in last["held"]
    assert "norm.weight" in last["held"] and "norm.weight" not in first["held"]
    assert not first["meta_left"] and not last["meta_left"]
    # The head's copy of the word embedding took the first stage's initial values.
    assert torch.equal(first["tied"], last["tied"]) and 0.01 < first["tied"].std().item() < 0.03
    assert 3.0 < first["loss"] == last["loss"] < 5.0


@pytest.mark.timeout(120)
def test_torchs_pipeline_stage_cannot_take_carries_whose_shapes_change():
    """Why `trainers.pipeline.runtime` is not torch's `PipelineStage` and schedule classes: a stage
    fixes its carries' shapes at its first micro batch, and a later step of another sequence length
    breaks the transfer (gloo: the received size does not match the buffer). This runtime sends each
    carry's shapes with it, which the whisper layouts above (utterances padded to each micro
    batch's own length) need."""
    with pytest.raises(AssertionError) as failure:
        torchrun(2, script="torch_pipeline_stage.py", timeout=100)
    assert "a step of length 5 ran" in str(failure.value)
    assert "a step of length 7 ran" not in str(failure.value)
    assert "Received data size doesn't match expected size" in str(failure.value)
