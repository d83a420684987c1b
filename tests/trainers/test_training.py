"""One-process training behaviour: accumulation, precision, recompute, meta-device construction."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest
import torch
from torch import nn
from torch.utils.data import default_collate
from torch.utils.flop_counter import FlopCounterMode

from helpers import TINY, lm_examples, tiny_gpt
from nlp.gpt import GPT
from trainers import Strategy, TrainConfig, Trainer, estimate_layouts
from trainers.loop.throughput import device_peak
from zoo.nn.cross_entropy import current_loss_gradients
from zoo.plan import ModelPlan
from zoo.parity import relative_error


def config(tmp_path, **overrides) -> TrainConfig:
    base = dict(global_batch_size=8, micro_batch_size=2, max_steps=3, lr=1e-2, warmup_steps=1, log_every=1,
                progress=False, output_dir=str(tmp_path / "run"))
    return TrainConfig(**{**base, **overrides})


def trained_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.full_state_dict().items()}


@pytest.mark.timeout(120)
def test_gradient_accumulation_does_not_change_the_result(tmp_path):
    accumulated = Trainer(tiny_gpt(), config(tmp_path, micro_batch_size=2))
    assert accumulated.fit(lm_examples(64))[0]["step"] == 1
    whole = Trainer(tiny_gpt(), config(tmp_path, micro_batch_size=8))
    whole.fit(lm_examples(64))
    a, b = trained_state(accumulated), trained_state(whole)
    for name in a:
        assert relative_error(a[name], b[name]) < 1e-5, name
    assert relative_error(a["embeddings.word.weight"], tiny_gpt().state_dict()["embeddings.word.weight"]) > 1e-3


@pytest.fixture(scope="module")
def fp32_losses(tmp_path_factory):
    trainer = Trainer(tiny_gpt(), config(tmp_path_factory.mktemp("fp32"), max_steps=60, warmup_steps=5))
    return [r["loss"] for r in trainer.fit(lm_examples(256))]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_converges_like_fp32(tmp_path, precision, fp32_losses):
    trainer = Trainer(tiny_gpt(), config(tmp_path, max_steps=60, warmup_steps=5), Strategy(zero=3, precision=precision))
    losses = [r["loss"] for r in trainer.fit(lm_examples(256))]
    assert fp32_losses[-1] < 0.25 * fp32_losses[0], fp32_losses[::10]
    assert losses[-1] < 0.25 * losses[0], losses[::10]
    assert abs(losses[-1] - fp32_losses[-1]) < 0.1 * fp32_losses[0]


def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    from trainers.state.loss_scale import DynamicLossScaler

    scaler = DynamicLossScaler(scale=1024.0, growth_interval=2)
    assert scaler.update(float("inf")) is False and scaler.scale == 512.0 and scaler.skipped_steps == 1
    assert scaler.update(1.0) and scaler.update(1.0) and scaler.scale == 1024.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("recompute", ["blocks", "selective"])
def test_recompute_gives_the_same_training(tmp_path, recompute):
    plain = Trainer(tiny_gpt(dropout=0.1), config(tmp_path))
    plain.fit(lm_examples(64))
    recomputed = Trainer(tiny_gpt(dropout=0.1), config(tmp_path), Strategy(recompute=recompute))
    recomputed.fit(lm_examples(64))
    a, b = trained_state(plain), trained_state(recomputed)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    if recompute == "blocks":  # fused zoo.nn blocks keep no more than selective would (see Strategy)
        assert recomputed.memory_report()[0]["activation_peak"] < plain.memory_report()[0]["activation_peak"]


class PlainEncoder(torch.nn.Module):
    """Unfused PyTorch layers declaring blocks: with dropout, CPU attention takes the math path and keeps
    probabilities and masks, which selective recompute drops."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(32, 2, 128, dropout=0.1, batch_first=True, norm_first=True) for _ in range(2))

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("blocks.*",))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        for block in self.blocks:
            x = block(x)
        return {"loss": torch.nn.functional.mse_loss(x, y)}


@pytest.mark.timeout(60)
def test_selective_recompute_saves_memory_on_unfused_layers(tmp_path):
    generator = torch.Generator().manual_seed(0)
    data = [{"x": x, "y": x.flip(-1)} for x in torch.randn(32, 24, 32, generator=generator)]
    peaks, states = {}, {}
    for recompute in ("none", "selective"):
        torch.manual_seed(0)
        trainer = Trainer(PlainEncoder(), config(tmp_path), Strategy(recompute=recompute))
        trainer.fit(data)
        peaks[recompute], states[recompute] = trainer.memory_report()[0]["activation_peak"], trained_state(trainer)
    assert peaks["selective"] < 0.9 * peaks["none"]
    for name, value in states["none"].items():
        assert torch.equal(value, states["selective"][name]), name


@pytest.mark.timeout(120)
def test_meta_device_model_is_materialised_after_sharding(tmp_path):
    with torch.device("meta"):
        model = GPT(dataclasses.replace(TINY))
    assert all(p.is_meta for p in model.parameters())
    trainer = Trainer(model, config(tmp_path, max_steps=5), Strategy(zero=3))
    history = trainer.fit(lm_examples(64))
    state = trained_state(trainer)
    assert not any(t.is_meta for t in state.values())
    assert 0.01 < state["embeddings.word.weight"].std().item() < 0.05
    assert history[-1]["loss"] < history[0]["loss"]


class SquaredError(nn.Module):
    """Two linear layers: no attention, so torch's own FLOP counter sees every multiply."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": (self.down(torch.relu(self.up(x))).squeeze(-1) - y).square().mean()}


@pytest.mark.timeout(60)
def test_each_record_carries_the_steps_flops_and_mfu(tmp_path, caplog):
    """From the measured (second) step on: the FLOPs of a step, counted once, equal torch's
    FlopCounterMode over the step's two micro batches; MFU is those over the step's seconds and
    the measured peak (measured once a process), and the log line shows it."""
    generator = torch.Generator().manual_seed(0)
    examples = [{"x": torch.randn(16, generator=generator), "y": torch.randn((), generator=generator)} for _ in range(16)]
    trainer = Trainer(SquaredError(), config(tmp_path, global_batch_size=8, micro_batch_size=4, max_steps=3))
    with caplog.at_level(logging.INFO, logger="trainers"):
        history = trainer.fit(examples)
    with FlopCounterMode(display=False) as counter:
        SquaredError()(**default_collate(examples[:4]))["loss"].backward()
    assert "flops" not in history[0]
    for record in history[1:]:
        assert record["flops"] == 2 * counter.get_total_flops()
        assert record["mfu"] == pytest.approx(record["flops"] / record["step_seconds"] / trainer.throughput.peak.flops)
        assert 0 < record["mfu"] < 1 and "measured" in record["mfu_peak"]
    assert trainer.memory_report()[0]["mfu"] == history[-1]["mfu"]
    assert re.search(r"MFU \d+\.\d%", caplog.text)
    assert device_peak(torch.device("cpu"), torch.float32) is trainer.throughput.peak


@pytest.mark.timeout(60)
def test_memory_report_and_metrics_file(tmp_path):
    trainer = Trainer(tiny_gpt(), config(tmp_path))
    trainer.fit(lm_examples(64))
    (report,) = trainer.memory_report()
    numel = sum(p.numel() for p in tiny_gpt().parameters())
    assert report["parameters"] == 4 * numel
    assert report["gradients"] == 4 * numel
    assert 8 * numel <= report["optimizer"] <= 8 * numel + 64 * 4
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"tokens_per_second"' in lines[-1]


class KeyRecordingGPT(GPT):
    """A GPT that remembers the keys of each output it returns."""

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        self.returned = getattr(self, "returned", []) + [sorted(output)]
        return output


def test_the_trainer_asks_for_the_loss_only_so_evaluation_forms_no_logits(tmp_path):
    model = KeyRecordingGPT(dataclasses.replace(TINY))
    trainer = Trainer(model, config(tmp_path, max_steps=1, eval_batches=2))
    trainer.fit(lm_examples(64), lm_examples(8, seed=3))
    assert model.returned and all(keys == ["loss"] for keys in model.returned)  # training and evaluation
    model.eval()
    ids = lm_examples(2)[0]["input_ids"][None]
    assert sorted(model(ids, labels=ids)) == ["logits", "loss"]  # a direct call in eval: Hugging Face's output


class LossGradientsRecordingGPT(GPT):
    """A GPT that remembers when the fused loss was to form its gradients at each forward."""

    def forward(self, *args, **kwargs):
        self.seen = getattr(self, "seen", []) + [current_loss_gradients()]
        return super().forward(*args, **kwargs)


@pytest.mark.timeout(60)
def test_loss_gradients_in_backward_train_the_same_model(tmp_path):
    """Strategy.loss_gradients reaches the model's fused loss; formed in backward, the gradients
    train the model the forward-formed ones do."""
    states = {}
    for when in ("forward", "backward"):
        model = LossGradientsRecordingGPT(dataclasses.replace(TINY))
        model.load_state_dict(tiny_gpt().state_dict())
        trainer = Trainer(model, config(tmp_path / when), Strategy(loss_gradients=when))
        trainer.fit(lm_examples(64))
        assert model.seen == [when] * 12  # 3 steps of 4 micro batches
        states[when] = trained_state(trainer)
    for name, value in states["forward"].items():
        assert relative_error(states["backward"][name], value) < 1e-5, name


class ResidueCounter(torch.nn.Module):
    """A model whose input_ids are residues (as the folding model's are)."""

    input_ids_unit = "residues"

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(48, 1)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": (self.embedding(input_ids)[..., 0] - labels.float() / 48).square().mean()}


@pytest.mark.timeout(60)
def test_progress_is_logged_in_the_units_of_the_task(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainers")
    Trainer(tiny_gpt(), config(tmp_path, max_steps=2, log_every=1)).fit(lm_examples(64))
    assert "training GPT (" in caplog.text and "steps 1-2 of 8 examples (2 a micro batch), 64 training examples" in caplog.text
    assert re.search(r"step 2/2 loss \d\.\d{4} lr .* grad norm .*, [\d,]+ tokens/s, [\d,]+ MiB", caplog.text)
    caplog.clear()
    history = Trainer(ResidueCounter(), config(tmp_path, max_steps=1)).fit(lm_examples(64))
    assert {"residues", "residues_per_second", "examples_per_second"} <= set(history[-1]) and "tokens" not in history[-1]
    assert "residues/s" in caplog.text and "tokens/s" not in caplog.text
    caplog.clear()
    points = [{"x": x, "y": x.sum()} for x in torch.randn(16, 4, generator=torch.Generator().manual_seed(0))]
    Trainer(Regression(), config(tmp_path, max_steps=1)).fit(points)
    assert re.search(r"step 1/1 .*, [\d.]+ examples/s", caplog.text)


class Regression(torch.nn.Module):
    """A plain module with no parallel plan: trained as one unit."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)}


@pytest.mark.timeout(60)
def test_plain_module_without_a_plan_trains_as_one_unit(tmp_path):
    generator = torch.Generator().manual_seed(0)
    xs = torch.randn(128, 4, generator=generator)
    weights = torch.tensor([0.3, -0.6, 0.15, 0.9])
    data = [{"x": x, "y": x @ weights} for x in xs]
    torch.manual_seed(0)
    trainer = Trainer(Regression(), config(tmp_path, max_steps=40, lr=1e-2, warmup_steps=2), Strategy(zero=3))
    history = trainer.fit(data)
    assert history[-1]["loss"] < 0.3 * history[0]["loss"]
    with pytest.raises(ValueError, match="recompute='blocks' needs blocks to recompute, but Regression declares none"):
        Trainer(Regression(), config(tmp_path), Strategy(recompute="blocks"))


class ScheduledRegression(Regression):
    """Records the optimizer steps the trainer announces, and the step each forward ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.announced, self.forward_steps, self.step = [], [], None

    def set_training_step(self, step: int) -> None:
        self.announced.append(step)
        self.step = step

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        self.forward_steps.append(self.step)
        return super().forward(x, y)


class Diverging(Regression):
    """A regression whose loss is NaN at the optimizer steps (0-based) in `poisoned`."""

    def __init__(self, poisoned: set[int]) -> None:
        super().__init__()
        self.poisoned, self.step = poisoned, None

    def set_training_step(self, step: int) -> None:
        self.step = step

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = super().forward(x, y)["loss"]
        return {"loss": loss * float("nan") if self.step in self.poisoned else loss}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chunked", [False, True], ids=["zero3", "chunks"])
def test_skipped_steps_are_logged_and_too_many_in_a_row_stop_training(tmp_path, caplog, chunked):
    strategy = (Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget="4GiB") if chunked
                else Strategy(zero=3))
    data = [{"x": x, "y": x.sum()} for x in torch.randn(32, 4, generator=torch.Generator().manual_seed(0))]
    caplog.set_level(logging.INFO, logger="trainers")
    history = Trainer(Diverging({1, 2}), config(tmp_path, max_steps=4, max_skipped_steps=3), strategy).fit(data)
    assert [r["skipped"] for r in history] == [False, True, True, False]
    assert "step 2 skipped: its gradient norm is nan (1 in a row; TrainConfig.max_skipped_steps=3)" in caplog.text
    assert "step 3 skipped: its gradient norm is nan (2 in a row" in caplog.text
    with pytest.raises(FloatingPointError, match=r"not finite in 3 steps in a row, up to step 4 "
                                                 r"\(TrainConfig.max_skipped_steps=3\): training diverged"):
        Trainer(Diverging({1, 2, 3}), config(tmp_path, max_steps=6, max_skipped_steps=3), strategy).fit(data)


@pytest.mark.timeout(60)
def test_a_model_with_set_training_step_follows_the_optimizer_step(tmp_path):
    data = [{"x": torch.randn(4), "y": torch.randn(())} for _ in range(32)]
    model = ScheduledRegression()
    Trainer(model, config(tmp_path, max_steps=3, global_batch_size=8, micro_batch_size=2), Strategy(zero=0)).fit(data)
    assert model.announced == [0, 1, 2]
    assert model.forward_steps == [0] * 4 + [1] * 4 + [2] * 4  # four micro batches per step


class FrozenFrontRegression(Regression):
    """A frozen block declared in the plan before the trained head; a batch with `features` already
    computed skips it (as a transducer fed its frozen encoder's cached outputs does)."""

    def __init__(self) -> None:
        super().__init__()
        self.front = torch.nn.Linear(4, 4)
        self.front.requires_grad_(False)

    def parallel_plan(self) -> ModelPlan:
        return ModelPlan(blocks=("front", "net"))

    def forward(self, y: torch.Tensor, x: torch.Tensor | None = None, features: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
        return super().forward(self.front(x) if features is None else features, y)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zero", [0, 2, 3])
def test_a_frozen_block_the_forward_skips_is_left_out_of_training(tmp_path, zero):
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = FrozenFrontRegression()
    with torch.no_grad():
        xs = torch.randn(64, 4, generator=generator)
        data = [{"features": f, "y": f.sum()} for f in model.front(xs)]
    frozen = model.front.weight.clone()
    trainer = Trainer(model, config(tmp_path, max_steps=20, lr=1e-2, warmup_steps=2), Strategy(zero=zero))
    history = trainer.fit(data)
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    state = trainer.full_state_dict()
    assert torch.equal(state["front.weight"], frozen)


def one_step(tmp_path, strategy: Strategy, anchor: dict[str, torch.Tensor] | None = None, **overrides
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """`Regression`'s parameters before and after one optimizer step (the same start and data), and
    that step's learning rate."""
    generator = torch.Generator().manual_seed(0)
    xs = torch.randn(8, 4, generator=generator)
    data = [{"x": x, "y": x.sum()} for x in xs]
    torch.manual_seed(0)
    model = Regression()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model, config(tmp_path, max_steps=1, warmup_steps=0, **overrides), strategy, anchor=anchor)
    record = trainer.fit(data)[-1]
    return start, trainer.full_state_dict(), record["lr"]


def one_step_changes(tmp_path, strategy: Strategy, lr_scales: dict[str, float]) -> dict[str, torch.Tensor]:
    """Each parameter's change in one optimizer step of `Regression` (the same start and data)."""
    start, after, _ = one_step(tmp_path, strategy, lr_scales=lr_scales)
    return {name: value - start[name] for name, value in after.items()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", [Strategy(zero=0), Strategy(zero=3), Strategy(zero=2, offload="optimizer")],
                         ids=["zero0", "zero3", "offload-optimizer"])
def test_lr_scales_scale_each_prefix_s_update(tmp_path, strategy):
    # AdamW's first update (its weight decay included) is linear in the learning rate, and the
    # gradients of the first step do not depend on it: a prefix's scale scales its update exactly.
    plain = one_step_changes(tmp_path / "plain", strategy, {})
    scaled = one_step_changes(tmp_path / "scaled", strategy, {"net.0.": 0.25, "net.0.bias": 4.0})
    assert plain["net.0.weight"].abs().min() > 0
    assert relative_error(scaled["net.0.weight"], 0.25 * plain["net.0.weight"]) < 1e-5
    assert relative_error(scaled["net.0.bias"], 4.0 * plain["net.0.bias"]) < 1e-5  # the longest prefix wins
    for name in ("net.2.weight", "net.2.bias"):
        assert relative_error(scaled[name], plain[name]) < 1e-6


@pytest.mark.timeout(60)
def test_lr_scales_that_cannot_hold_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"prefixes \['encoder.'\] start no trainable parameter name of Regression "
                                         r"\(its top-level names: net.\)"):
        Trainer(Regression(), config(tmp_path, lr_scales={"encoder.": 0.1}))
    with pytest.raises(ValueError, match=r"Strategy\(offload='chunks'\) updates a whole chunk at one learning rate"):
        Trainer(Regression(), config(tmp_path, lr_scales={"net.": 0.1}),
                Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget="1GiB"))
    with pytest.raises(ValueError, match="finite scales > 0"):
        config(tmp_path, lr_scales={"net.": 0.0})
    with pytest.raises(TypeError, match="lr_scales must be a dict of str prefixes to numbers"):
        config(tmp_path, lr_scales=[("net.", 0.1)])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", [Strategy(zero=0), Strategy(zero=1), Strategy(zero=3),
                                      Strategy(zero=2, offload="optimizer")],
                         ids=["zero0", "zero1", "zero3", "offload-optimizer"])
def test_anchor_decay_pulls_each_update_back_toward_its_anchor(tmp_path, strategy):
    # After AdamW's step a parameter under a prefix moves lr x lr_scale x decay of the way to its
    # anchor: the given tensor, or its value when the trainer was made; the others are untouched.
    start, plain, lr = one_step(tmp_path / "plain", strategy)
    given = {"net.0.weight": torch.randn(16, 4, generator=torch.Generator().manual_seed(1))}
    _, scaled_plain, _ = one_step(tmp_path / "scaled", strategy, lr_scales={"net.0.bias": 2.0})
    _, anchored, anchored_lr = one_step(tmp_path / "anchored", strategy, anchor=given, lr_scales={"net.0.bias": 2.0},
                                        anchor_decay={"net.0.": 5.0, "net.2.bias": 20.0})
    assert anchored_lr == lr > 0
    expected = {
        "net.0.weight": plain["net.0.weight"] + lr * 5.0 * (given["net.0.weight"] - plain["net.0.weight"]),
        "net.0.bias": scaled_plain["net.0.bias"] + lr * 2.0 * 5.0 * (start["net.0.bias"] - scaled_plain["net.0.bias"]),
        "net.2.weight": plain["net.2.weight"],
        "net.2.bias": plain["net.2.bias"] + lr * 20.0 * (start["net.2.bias"] - plain["net.2.bias"]),
    }
    for name, value in expected.items():
        assert relative_error(anchored[name], value) < 1e-6, name
    assert (anchored["net.0.weight"] - plain["net.0.weight"]).abs().min() > 0  # every element was pulled


@pytest.mark.timeout(180)
@pytest.mark.parametrize("offload", ["none", "optimizer"])
def test_the_measured_step_and_the_estimate_count_the_anchors(tmp_path, offload):
    # One more copy of each anchored parameter (fp32 on the CPU beside its master under offload),
    # filed as "other" by the trainer's measured step and by the estimator's trace alike.
    anchored = {"anchor_decay": {"blocks.0.": 1.0}}
    strategy = Strategy(offload=offload)
    measured = {}
    for name, overrides in (("plain", {}), ("anchored", anchored)):
        trainer = Trainer(tiny_gpt(), config(tmp_path / name, **overrides), strategy)
        trainer.fit(lm_examples(64))
        (measured[name],) = trainer.memory_report()
    batch = {key: torch.stack([row[key] for row in lm_examples(2)]) for key in ("input_ids", "labels")}
    plain, with_anchors = estimate_layouts(tiny_gpt(), batch, [(strategy, 1, config(tmp_path, micro_batch_size=2)),
                                                              (strategy, 1, config(tmp_path, micro_batch_size=2, **anchored))])
    anchor_bytes = 4 * sum(p.numel() for name, p in tiny_gpt().named_parameters() if name.startswith("blocks.0."))
    assert anchor_bytes > 0
    assert measured["anchored"]["other"] - measured["plain"]["other"] == anchor_bytes
    assert with_anchors.ranks[0].other - plain.ranks[0].other == anchor_bytes
    assert with_anchors.peak - plain.peak == anchor_bytes


@pytest.mark.timeout(60)
def test_anchor_decay_that_cannot_hold_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"anchor_decay prefixes \['encoder.'\] start no trainable parameter"):
        Trainer(Regression(), config(tmp_path, anchor_decay={"encoder.": 1.0}))
    with pytest.raises(ValueError, match=r"anchor_decay treats parameters apart, but Strategy\(offload='chunks'\)"):
        Trainer(Regression(), config(tmp_path, anchor_decay={"net.": 1.0}),
                Strategy(offload="chunks", offload_dir=str(tmp_path / "chunks"), memory_budget="1GiB"))
    with pytest.raises(ValueError, match=r"anchor names parameters TrainConfig.anchor_decay does not anchor "
                                         r"\(anchor_decay=\{'net.0.': 1.0\}\): \['net.2.weight'\]"):
        Trainer(Regression(), config(tmp_path, anchor_decay={"net.0.": 1.0}), anchor={"net.2.weight": torch.zeros(1, 16)})
    with pytest.raises(ValueError, match=r"anchor\['net.0.weight'\] has shape \(4, 16\); the parameter has \(16, 4\)"):
        Trainer(Regression(), config(tmp_path, anchor_decay={"net.0.": 1.0}), anchor={"net.0.weight": torch.zeros(4, 16)})
    with pytest.raises(ValueError, match=r"moves 'net.0.weight' lr x lr_scale x decay = 2 of the way .* expected at most 1"):
        Trainer(Regression(), config(tmp_path, lr=0.1, anchor_decay={"net.0.": 20.0}))
    with pytest.raises(ValueError, match="finite decays > 0"):
        config(tmp_path, anchor_decay={"net.": 0.0})
