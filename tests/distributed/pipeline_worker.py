"""Pipeline-parallel scenarios, run by the tests under torchrun; each writes its results (full
tensors gathered on rank 0) to a file the test compares.

    pipeline_worker.py parity OUT RUN ...   RUN = model/LAYOUT: train 3
                                            steps (dp = world / (pp * tp)); losses, gradient norms, eval
                                            loss, params, tokens per expert of each MoE layer
    pipeline_worker.py meta OUT              GPT built on the meta device at pp=2: what each rank holds,
                                            the tied copies after initialisation, one step's loss
    pipeline_worker.py save DIR LAYOUT       GPT, 4 steps, checkpoint every 2: losses + params (DIR/run.pt)
    pipeline_worker.py resume DIR LAYOUT OUT resume DIR's step-2 checkpoint, run steps 3-4: losses + params
One launch runs several commands separated by "+", one after another.
LAYOUT = schedule/pp/stages_per_rank/zero[/tp[/sequence_parallel]][:mM][:fp16][:compiled][:epE] (see `strategy`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
sys.path += [str(Path(__file__).resolve().parents[1])]

from torch.utils.data import default_collate  # noqa: E402

from asr.data import collate_speech  # noqa: E402
from helpers import lm_examples, run_commands, tiny_gpt  # noqa: E402
from protein.data import collate_folding  # noqa: E402
from tiny_transducer import tiny, tiny_whisper  # noqa: E402
from trainers import Strategy, TrainConfig, Trainer  # noqa: E402
from trainers.memory.recompute import clean_fqn  # noqa: E402
from trainers.speed.compile import compiled_forwards  # noqa: E402
from zoo.nn.moe import MoEFeedForward  # noqa: E402
from trainers.parallel.mesh import exit_process, shutdown_distributed  # noqa: E402
from parity_models import FeedForwardLM  # noqa: E402
from tiny_models import (digit_examples, fold_examples, mlm_examples, speech_examples,  # noqa: E402
                         tiny_bert, tiny_fold, tiny_translator, tiny_vit, translation_examples)

MODELS = {
    "gpt": (lambda: tiny_gpt(n_layer=4), lm_examples, default_collate),
    "gpt_dropout": (lambda: tiny_gpt(n_layer=4, dropout=0.1), lm_examples, default_collate),
    "moe": (lambda: tiny_gpt(n_layer=4, n_experts=4, moe_top_k=2), lm_examples, default_collate),
    "custom": (lambda: FeedForwardLM(layers=4), lm_examples, default_collate),
    "bert": (tiny_bert, mlm_examples, default_collate),
    "vit": (tiny_vit, digit_examples, default_collate),
    "conformer": (lambda: tiny(loss="full"), speech_examples, collate_speech),
    "whisper": (lambda: tiny_whisper(loss="full"), speech_examples, collate_speech),
    "fold": (lambda: tiny_fold(max_recycles=0), fold_examples, collate_folding),
    "translator": (tiny_translator, translation_examples, default_collate),
    "marian": (lambda: tiny_translator(marian=True), translation_examples, default_collate),
}
"""(build, examples, collate): GPT (also with dropout 0.1, and with 4 experts a block, top 2) and the
test's own model with four blocks (pp=2 x 2 stages per
rank at most), GPT without biases (a key bias's gradient is zero up to rounding, which AdamW
amplifies); the others with two (tests/distributed/worker.py), the translators with two encoder and two decoder
blocks (tests/tiny_models.py), the folding model without recycling (which a pipeline does not run)."""


def config(**overrides) -> TrainConfig:
    """SGD-like conditions for parity: AdamW at lr 1e-3 with eps 1e-6 does not amplify
    summation-order noise (an element whose gradient is zero up to rounding takes a step of at
    most lr x its gradient / 1e-6, not of lr). No memory measurement unless asked (it doubles a
    step's time)."""
    base = dict(global_batch_size=8, micro_batch_size=2, max_steps=3, lr=1e-3, warmup_steps=1, log_every=1,
                progress=False, output_dir="/tmp/memzoo-test-runs", grad_clip=0.5, eval_batches=2, eps=1e-6,
                measure_memory=False)
    return TrainConfig(**{**base, **overrides})


def strategy(layout: str) -> Strategy:
    """schedule/pp/stages_per_rank/zero[/tp[/sequence_parallel]][:mM][:fp16][:compiled][:epE] as a
    Strategy (mM: M micro batches per pipeline run; fp16: fp16 compute with loss scaling; compiled:
    the blocks compiled; epE: expert parallelism over E data-parallel ranks)."""
    layout, *options = layout.split(":")
    fields = layout.split("/")
    schedule, pp, stages_per_rank, zero, tp, sp = fields + ["1", "0"][len(fields) - 4:]
    runs = [int(o[1:]) for o in options if o.startswith("m")]
    ep = [int(o[2:]) for o in options if o.startswith("ep")]
    return Strategy(pp=int(pp), pp_schedule=schedule, stages_per_rank=int(stages_per_rank), zero=int(zero),
                    tp=int(tp), sequence_parallel=sp == "1", microbatches=runs[0] if runs else None,
                    precision="fp16" if "fp16" in options else "fp32",
                    compile="blocks" if "compiled" in options else "none", ep=ep[0] if ep else 1)


def example(data, collate=default_collate) -> dict[str, torch.Tensor]:
    """One micro batch, for the pipeline split's cost estimate."""
    return collate([data[0], data[1]])


def parity(out: str, *runs: str) -> None:
    results = {}
    for run in runs:
        model, layout = run.split("/", 1)
        build, examples, collate = MODELS[model]
        data = examples(64)
        held_out = [data[i] for i in range(4)]
        torch.manual_seed(7)
        trainer = Trainer(build(), config(), strategy(layout), example_batch=example(data, collate))
        counts = expert_counts(trainer.model)
        history = trainer.fit(data, held_out, collate_fn=collate)
        every: list[dict] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(every, {name: total.tolist() for name, total in counts.items()})
        results[run] = {"params": trainer.full_state_dict(), "losses": [r["loss"] for r in history],
                        "grad_norms": [r["grad_norm"] for r in history], "eval_loss": history[-1]["eval_loss"],
                        "compiled_calls": sum(f.compiled_calls for f in compiled_forwards(trainer.model)),
                        "expert_counts": {name: [sum(column) for column in zip(*(found[name] for found in every
                                                                                  if name in found))]
                                          for name in sorted({name for found in every for name in found})}}
    if dist.get_rank() == 0:
        torch.save(results, out)


def expert_counts(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each mixture-of-experts layer of `model` (by its name, wrappers' prefixes removed): the tokens
    sent to each expert, summed over the forwards that follow (training and evaluation)."""
    totals: dict[str, torch.Tensor] = {}

    def count(name: str):
        def hook(module, args, output) -> None:
            totals[name] = totals.get(name, 0) + module.expert_counts
        return hook

    for name, module in model.named_modules():
        if isinstance(module, MoEFeedForward):
            module.register_forward_hook(count(clean_fqn(name)))
    return totals


def meta(out: str) -> None:
    data = lm_examples(8)
    with torch.device("meta"):
        model = tiny_gpt(n_layer=4)
    trainer = Trainer(model, config(max_steps=1, global_batch_size=4), strategy("1f1b/2/1/0"), example_batch=example(data))
    rank = dist.get_rank()
    held = sorted(name for name, _ in trainer.model.named_parameters())
    word = trainer.model.embeddings.word.weight
    tied = (word.full_tensor() if hasattr(word, "full_tensor") else word).detach().clone()
    history = trainer.fit(data)
    report = {"held": held, "tied": tied, "loss": history[-1]["loss"],
              "blocks": [list(r) for r in trainer.pipeline_parts.layout.ranges],
              "meta_left": [n for n, p in trainer.model.named_parameters() if p.is_meta]}
    every: list[dict] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, report)
    if rank == 0:
        torch.save(every, out)


def save(directory: str, layout: str) -> None:
    data = lm_examples(64)
    trainer = Trainer(MODELS["gpt"][0](), config(max_steps=4, checkpoint_every=2, checkpoint_dir=directory),
                      strategy(layout), example_batch=example(data))
    history = trainer.fit(data)
    params = trainer.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"params": params, "losses": [r["loss"] for r in history]}, Path(directory) / "run.pt")


def resume(directory: str, layout: str, out: str) -> None:
    data = lm_examples(64)
    torch.manual_seed(123)  # other initial values, all replaced by the checkpoint's
    trainer = Trainer(tiny_gpt(seed=123, n_layer=4), config(max_steps=4, checkpoint_dir=directory), strategy(layout),
                      example_batch=example(data))
    trainer.resume(Path(directory) / "step_00000002")
    history = trainer.fit(data)
    params = trainer.full_state_dict()
    if dist.get_rank() == 0:
        torch.save({"params": params, "losses": [r["loss"] for r in history]}, out)


if __name__ == "__main__":
    run_commands({"parity": parity, "meta": meta, "save": save, "resume": resume}, sys.argv[1:])
    shutdown_distributed()
    exit_process(0)
