"""torch.compile through `Strategy.compile`: each zoo family's blocks compile whole (fullgraph, so
a graph break fails), give eager's loss and gradients within 1e-5 and keep no more for backward
than eager; a compiled training run with dropout matches an eager one with and without recompute;
what cannot compose is refused. The multi-process layouts (tensor, sequence and pipeline parallelism, ZeRO-3)
run compiled in tests/distributed/test_tensor_parallel.py and test_pipeline.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import default_collate

from helpers import lm_examples, tiny_gpt
from tiny_models import TP_MODELS
from trainers import Strategy, TrainConfig, Trainer
from trainers.speed.compile import apply_compile, compiled_forwards
from zoo.parity import relative_error
from zoo.plan import model_plan

PARTITIONED = "aot_eager_decomp_partition"
"""torch's backend that traces, decomposes and partitions a graph as Inductor does (the same
min-cut partitioner and activation budget: what a block keeps) and runs it eagerly, without
generating and compiling C++ kernels (5-20 s a family on two cores with a cold cache)."""
BACKENDS = {"gpt": "inductor", "gpt_dropout": "inductor", "moe": PARTITIONED, "bert": PARTITIONED, "vit": PARTITIONED,
            "conformer": PARTITIONED, "fold": PARTITIONED}
"""Inductor generates GPT's kernels (with and without dropout, whose random operators Inductor's own
passes rewrite before partitioning: the partitioned trace alone keeps 3% more); the other families
trace and partition as Inductor would (`PARTITIONED`). Compiled training on Inductor's kernels runs
in test_compiled_training_matches_eager and the tensor-parallel and pipeline tests (GPT), and
benchmarks/speed.py compiles BERT and ViT."""
MODELS = {**TP_MODELS, "gpt_dropout": (lambda: tiny_gpt(dropout=0.1), lm_examples, None)}
"""The parity models (tests/tiny_models.py) and GPT with dropout 0.1 (attention's chunked operator;
compiled blocks draw eager's masks)."""

ZERO_GRADIENT = ("attn.k.bias", "row_attention.pair_norm.bias")
"""Parameters whose gradients are zero up to rounding (a key bias; see test_tensor_parallel.py)."""


def saved_bytes_and_gradients(model: nn.Module, batch: dict) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """The loss, the bytes of the storages autograd saves for backward (each once), the gradients."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    torch.manual_seed(11)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch)["loss"]
    loss.backward()
    return loss.detach(), sum(storages.values()), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", BACKENDS)
def test_each_zoo_family_s_blocks_compile_whole_and_keep_what_eager_keeps(name):
    build, examples, collate = MODELS[name]
    torch.manual_seed(5)
    data = examples(8)
    batch = (collate or default_collate)([data[i] for i in range(4)])
    eager, compiled = build(), build()
    blocks = model_plan(compiled).block_names(compiled)
    apply_compile(compiled, Strategy(compile="blocks", compile_backend=BACKENDS[name]), blocks)
    loss, eager_saved, grads = saved_bytes_and_gradients(eager, batch)
    compiled_loss, compiled_saved, compiled_grads = saved_bytes_and_gradients(compiled, batch)

    forwards = compiled_forwards(compiled)
    assert len(forwards) == len(blocks) >= 2
    assert all(f.compiled_calls >= 1 and f.eager_calls == 0 for f in forwards)
    assert relative_error(compiled_loss, loss) < 1e-5
    assert compiled_grads.keys() == grads.keys()
    for key, grad in grads.items():
        if grad.any() and not key.endswith(ZERO_GRADIENT):
            assert relative_error(compiled_grads[key], grad) < 1e-5, key
    print("SAVED", name, compiled_saved, eager_saved, compiled_saved / eager_saved)
    assert compiled_saved <= eager_saved * 1.01, (compiled_saved, eager_saved)


def config(tmp_path, **overrides) -> TrainConfig:
    base = dict(global_batch_size=8, micro_batch_size=2, max_steps=3, lr=1e-2, warmup_steps=1, log_every=1,
                progress=False, output_dir=str(tmp_path / "run"))
    return TrainConfig(**{**base, **overrides})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", [dict(compile="blocks"), dict(compile="blocks", recompute="blocks"),
                                      dict(compile="blocks", recompute="selective"),
                                      dict(compile="model", compile_backend="aot_eager")],
                         ids=["blocks", "blocks+recompute", "blocks+selective", "model"])
def test_compiled_training_matches_eager(tmp_path, strategy):
    """With dropout: compiled blocks draw eager's masks (`zoo.nn.dropout`), and a recomputed block
    the same ones again."""
    eager = Trainer(tiny_gpt(dropout=0.1), config(tmp_path), Strategy(recompute=strategy.get("recompute", "none")))
    eager_losses = [r["loss"] for r in eager.fit(lm_examples(64))]
    compiled = Trainer(tiny_gpt(dropout=0.1), config(tmp_path), Strategy(**strategy))
    losses = [r["loss"] for r in compiled.fit(lm_examples(64))]

    forwards = compiled_forwards(compiled.model)
    # Each step runs 4 micro batches; the memory probe's step and the FLOP count's run eagerly.
    assert sum(f.compiled_calls for f in forwards) >= len(forwards) * 4
    assert all(f.eager_calls > 0 for f in forwards)
    for ours, theirs in zip(losses, eager_losses, strict=True):
        assert abs(ours - theirs) <= 1e-5 * theirs
    reference = eager.full_state_dict()
    for key, value in compiled.full_state_dict().items():
        assert relative_error(value, reference[key]) < 1e-5, key


def test_what_compile_cannot_take_is_refused(tmp_path):
    assert Strategy(compile=False).compile == "none"
    with pytest.raises(ValueError, match=r"Strategy.compile must be one of 'none', 'blocks', 'model'; got 'graph'"):
        Strategy(compile="graph")
    with pytest.raises(ValueError, match="offload='chunks' runs with compile='none'.*got compile='blocks'"):
        Strategy(compile="blocks", offload="chunks", offload_dir=str(tmp_path), memory_budget="1GiB")
    planless = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="compile='blocks' compiles each block.*Sequential declares none"):
        apply_compile(planless, Strategy(compile="blocks"), [])

