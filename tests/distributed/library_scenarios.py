"""The bring-your-own-model scenarios of worker.py: transformers' models (tests/library_models.py)
and modules written in the tests (`MODELS`) trained 3 steps through the Trainer under a strategy,
nothing written per model.

    worker.py library OUT MODEL/STRATEGY ...    each run's losses and parameters, or the error
                                                 that refused it (a LayoutRefused or ValueError)

Strategies (`STRATEGIES`) name their number of ranks; "one" is the one-process reference.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist

from dataclasses import replace

from helpers import chunk_budget, lm_examples, tiny_gpt
from library_models import LIBRARY_MODELS
from parity_models import HeadRoutedLM, KeywordMemoryLM, UnregionedGainedLM
from trainers import LoRA, Strategy, TrainConfig, Trainer


def qwen3_norms_unplanned():
    """Qwen3 whose plan leaves out its q/k norms, which run on each rank's heads."""
    model = LIBRARY_MODELS["qwen3"][0]()
    model.tp_plan = {pattern: style for pattern, style in model.tp_plan.items() if not pattern.endswith("_norm")}
    return model


def gpt_norm_outside_sequence_parallel():
    """The zoo's GPT whose plan leaves its final norm, on sequence shards, out of `sequence_parallel`."""
    model = tiny_gpt()
    plan = model.parallel_plan()
    model.parallel_plan = lambda: replace(plan, sequence_parallel=tuple(p for p in plan.sequence_parallel if p != "norm"))
    return model


MODELS = {**LIBRARY_MODELS,
          "qwen3_norms_unplanned": (qwen3_norms_unplanned, lm_examples),
          "gpt_norm_outside_sp": (gpt_norm_outside_sequence_parallel, lm_examples),
          "gain_unplanned": (lambda: UnregionedGainedLM(summed=False), lm_examples),
          "gain_summed": (lambda: UnregionedGainedLM(summed=True), lm_examples),
          "keyword_memory": (KeywordMemoryLM, lm_examples),
          "routed_heads": (HeadRoutedLM, lm_examples),
          "early_exit": (lambda: HeadRoutedLM(early_exit=True), lm_examples)}
"""name -> (factory, examples(count)): the library models, and plans that leave a parameter meeting
the shards unnamed (Qwen3's q/k norms, GPT's final norm under sequence parallelism, a learned gain
between a column- and a row-parallel linear), the gain kept whole with its gradient summed, a
tensor passed into a region by keyword, and language models whose data choose their output head
(and, with an early exit, whether the last block runs)."""

STRATEGIES: dict[str, tuple[int, dict]] = {
    "one": (1, {}),
    "zero1": (2, dict(zero=1)),
    "zero3": (2, dict(zero=3)),
    "zero3_offload": (2, dict(zero=3, offload="optimizer")),
    "tp2": (2, dict(tp=2)),
    "tp2_sp": (2, dict(tp=2, sequence_parallel=True)),
    "recompute": (1, dict(recompute="blocks")),
    "pp2": (2, dict(pp=2, pp_schedule="1f1b")),
    "chunks": (2, dict(zero=3, offload="chunks")),
    "dp2_tp2_zero3": (4, dict(zero=3, tp=2)),
    "pp2_dp2_zero3": (4, dict(pp=2, zero=3)),
    "quarter": (1, {}),
    "lora": (1, dict(adapter=LoRA(rank=4))),
    "lora_zero3": (2, dict(zero=3, adapter=LoRA(rank=4))),
    "lora_chunks": (2, dict(zero=3, offload="chunks", adapter=LoRA(rank=4))),
    "lora_pp2": (2, dict(pp=2, pp_schedule="1f1b", adapter=LoRA(rank=4))),
    "lora_tp2": (2, dict(tp=2, adapter=LoRA(rank=4))),
}
"""name -> (ranks, Strategy fields): dp=2 ZeRO-1; ZeRO-3; with the optimizer offloaded; tp=2; tp=2 with
sequence parallelism; every block recomputed; a 1F1B pipeline of 2 stages; ZeRO-3 over chunks on
disk; dp=2 x tp=2 ZeRO-3; 2 stages x dp=2 ZeRO-3; a quarter of the peak (`quarter_peak`); rank-4 LoRA
adapters on every linear but the head (`TrainConfig.adapter`: its key goes there, not to the Strategy)
in one process (the reference of the other "lora" runs), under ZeRO-3, over chunks, in a pipeline and
under tp=2."""


def reference(strategy: str) -> str:
    """The one-process strategy a run under `strategy` is compared with: "lora" for adapter runs,
    else "one"."""
    return "lora" if "adapter" in STRATEGIES[strategy][1] else "one"


CHUNK_ROOM = 64 << 20
"""Bytes of memory left to chunks under offload="chunks", beside what the process holds."""
QUARTER_ROWS = 128
"""Examples a step under "quarter", all in one micro batch: enough that activations, which a
budget can shrink, outweigh the model states, which one process cannot."""


def quarter_peak(build, examples, folder: str) -> dict:
    """3 steps of QUARTER_ROWS examples unconstrained, then 3 under `Strategy(memory_budget=)` a
    quarter of that run's measured peak (the trainer plans at fit: recompute, chunks, a smaller micro
    batch): the second run's losses and parameters, the budget, the peak each measured step held, and
    as "reference" the unconstrained run at the micro batch the plan chose (a third run where that
    is smaller: a loss averaged over each micro batch's unmasked tokens changes with the split)."""
    config = TrainConfig(global_batch_size=QUARTER_ROWS, micro_batch_size=QUARTER_ROWS, max_steps=3, lr=1e-3,
                         log_every=1, progress=False, output_dir=f"{folder}/free")
    free = Trainer(build(), config)
    free_history = free.fit(examples(3 * QUARTER_ROWS))
    budget = free.memory_report()[0]["peak"] // 4
    held = Trainer(build(), replace(config, output_dir=f"{folder}/held"), Strategy(memory_budget=budget))
    history = held.fit(examples(3 * QUARTER_ROWS))
    if held.config.micro_batch_size != QUARTER_ROWS:
        free = Trainer(build(), replace(config, micro_batch_size=held.config.micro_batch_size, output_dir=f"{folder}/same"))
        free_history = free.fit(examples(3 * QUARTER_ROWS))
    return {**trained(history, held.full_state_dict()), "reference": trained(free_history, free.full_state_dict()),
            "budget": budget, "peaks": [record["measured_peak_bytes"] for record in history if "measured_peak_bytes" in record],
            "plan": held.budget.plan.describe()}


def trained(history: list[dict], params: dict[str, torch.Tensor]) -> dict:
    """A run's result: its losses and its parameters."""
    return {"losses": [record["loss"] for record in history],
            "params": {key: value.clone() for key, value in params.items()}}


def library(out: str, *runs: str) -> None:
    results = {}
    for run in runs:
        model, name = run.split("/")
        ranks, fields = STRATEGIES[name]
        adapter = fields.get("adapter")
        fields = {key: value for key, value in fields.items() if key != "adapter"}
        if ranks != int(os.environ["WORLD_SIZE"]):
            raise ValueError(f"{run} runs on {ranks} ranks; this launch has {os.environ['WORLD_SIZE']}")
        build, examples = MODELS[model]
        with tempfile.TemporaryDirectory() as folder:
            chunked = {"offload_dir": folder, "memory_budget": chunk_budget(CHUNK_ROOM)} if fields.get("offload") == "chunks" else {}
            strategy = Strategy(**fields, **chunked)
            config = TrainConfig(global_batch_size=8, micro_batch_size=2, max_steps=3, lr=1e-3, log_every=1,
                                 progress=False, output_dir=f"{folder}/run", adapter=adapter)
            try:
                if name == "quarter":
                    results[run] = quarter_peak(build, examples, folder)
                    continue
                trainer = Trainer(build(), config, strategy)
                history = trainer.fit(examples(32))
            except ValueError as error:  # LayoutRefused and MemoryBudgetError included
                results[run] = {"refused": f"{type(error).__name__}: {error}"}
                continue
            results[run] = trained(history, trainer.full_state_dict())
    if dist.get_rank() == 0:
        torch.save(results, out)
