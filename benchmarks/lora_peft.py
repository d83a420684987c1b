"""LoRA fine-tuning of a transformers Llama shaped as SmolLM2-135M (random weights: 30 blocks of 576,
grouped-query attention 9/3, vocabulary 49,152, tied head), memzoo's Trainer against PEFT +
transformers with a plain AdamW loop, each in a fresh process: the peak resident memory above the
process once the model is built (VmHWM, reset before the first step) and the median step time.

    python benchmarks/lora_peft.py [--length 512] [--rows 1] [--steps 4] [--turns 2]

Variants (rank 8, alpha 16, every linear but the head, AdamW lr 1e-4, fp32):
    memzoo                 Trainer(adapter=LoRA(...)), nothing recomputed
    memzoo-recompute       the same with Strategy(recompute="blocks")
    peft                   peft.get_peft_model + a plain loop
    peft-checkpointing     the same with transformers' gradient checkpointing
The variants run in turns (`--turns` rounds), and each figure is the median over its rounds.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("memzoo", "memzoo-recompute", "peft", "peft-checkpointing")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def smollm2_shaped():
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-5, use_cache=False))


def worker(variant: str, length: int, rows: int, steps: int) -> dict:
    import torch

    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    from measure import status_bytes

    model = smollm2_shaped()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 49152, (steps * rows, length), generator=generator)
    examples = [{"input_ids": row, "labels": row} for row in ids]
    times: list[float] = []
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM from here on
    built = status_bytes("VmRSS")
    if variant.startswith("memzoo"):
        from trainers import LoRA, Strategy, TrainConfig, Trainer

        config = TrainConfig(global_batch_size=rows, micro_batch_size=rows, max_steps=steps, lr=1e-4, warmup_steps=0,
                             min_lr_ratio=1.0, weight_decay=0.0, grad_clip=0.0, log_every=1, progress=False,
                             measure_memory=False, output_dir=tempfile.mkdtemp(),
                             adapter=LoRA(rank=8, alpha=16, targets=tuple(TARGETS)))
        strategy = Strategy(recompute="blocks" if variant.endswith("recompute") else "none")
        trainer = Trainer(model, config, strategy)
        history = trainer.fit(examples)
        losses, times = [r["loss"] for r in history], [r["step_seconds"] for r in history]
    else:
        import peft

        if variant.endswith("checkpointing"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS))
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0,
                                      fused=True)
        losses = []
        for step in range(steps):
            started = time.perf_counter()
            batch = ids[step * rows : (step + 1) * rows]
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            times.append(time.perf_counter() - started)
    return {"variant": variant, "peak_above_built": status_bytes("VmHWM") - built, "built": built,
            "step_seconds": times, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.length, args.rows, args.steps)))
        return
    rounds: dict[str, list[dict]] = {}
    for _ in range(args.turns):
        for variant in args.variants.split(","):
            done = subprocess.run([sys.executable, __file__, "--worker", variant, "--length", str(args.length),
                                   "--rows", str(args.rows), "--steps", str(args.steps)],
                                  capture_output=True, text=True, check=True)
            rounds.setdefault(variant, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"SmolLM2-135M-shaped Llama, LoRA rank 8 on every linear but the head, {args.rows} x {args.length} tokens, "
          f"fp32, {args.steps} steps a process, {args.turns} turns\n")
    print("| variant | peak RSS above the built model (MiB) | step time (s, median) | first loss | last loss |")
    print("|---|---|---|---|---|")
    for variant, results in rounds.items():
        peak = statistics.median(r["peak_above_built"] for r in results) / 2**20
        step = statistics.median(t for r in results for t in r["step_seconds"][1:])  # the first step warms up
        print(f"| {variant} | {peak:.1f} | {step:.3f} | {results[0]['losses'][0]:.4f} | {results[0]['losses'][-1]:.4f} |")


if __name__ == "__main__":
    main()
