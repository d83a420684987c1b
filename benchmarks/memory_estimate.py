"""The memory estimator against the measured training step, for every zoo model family at three
sizes and a model written here, at ZeRO 0 and 3 with recompute none and blocks, on 2 ranks.

    python benchmarks/memory_estimate.py [--out benchmarks/results/memory_estimate.jsonl]
                                         [--families gpt bert vit conformer fold conv_lm]
                                         [--world 2] [--reuse-measured]
    MEMZOO_DEVICE=cuda python benchmarks/memory_estimate.py --world GPUS   (on GPUs: beside
                                         torch.cuda.max_memory_allocated instead of RSS)

For each family and size it
- measures: one torchrun launch (2 gloo ranks) trains every case for 2 steps of 2 micro batches a
  rank (each micro batch the same example repeated, which is what the estimate is given); rank 0's
  memory report of the second step (the project's tracker: live tensor bytes by category);
- estimates: `trainers.estimate_layouts` of the four cases in one estimating process;
- cross-checks the largest size with peak RSS: a fresh torchrun launch per case (glibc returning
  freed large blocks: `RETURN_FREED_BLOCKS`), rank 0's peak resident set size less its resident
  set size before the trainer was built, less the same growth of a nine-parameter model (process
  group, threads, the trainer itself).
Then it prints the table of BENCHMARKS.md (MiB; estimate / measured ratios).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import finish_worker, launch_ranks, ranks_device  # noqa: E402

FAMILIES = ("gpt", "bert", "vit", "conformer", "fold", "conv_lm")
RETURN_FREED_BLOCKS = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc serves blocks of 64 KiB and more from their own mappings, returned to the system when
freed: otherwise it keeps freed tensors' memory in its heap, and the peak resident set counts
memory that a later tensor of another size could not reuse (gpt L, ZeRO 0: 235 MiB of growth
with the default threshold, 160 MiB with this one, against 133 MiB of tensors at the peak)."""
BASELINE = "baseline"
"""A nine-parameter model, launched once per case kind: the resident set a rank grows by anyway."""
SIZES = ("S", "M", "L")
CASES = ((0, "none"), (0, "blocks"), (3, "none"), (3, "blocks"))
"""(ZeRO stage, recompute) of each measured case."""
MICRO = 4
"""Rows of a micro batch."""
WIDTHS = {"S": (2, 64), "M": (4, 128), "L": (6, 192)}
"""(blocks, width) of each size."""


class ConvLM(nn.Module):
    """A model written here, not from the zoo: token embedding, residual blocks of a causal
    depthwise convolution and a gated feed-forward, a head; its plan names the blocks."""

    def __init__(self, vocab: int, width: int, blocks: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_ConvBlock(width) for _ in range(blocks))
        self.head = nn.Linear(width, vocab)

    def parallel_plan(self):  # noqa: ANN201
        from zoo.plan import ModelPlan

        return ModelPlan(blocks=("blocks.*",))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
        logits = self.head(hidden)
        return {"loss": F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())}


class _Baseline(nn.Module):
    """Nine parameters: what a rank's resident set grows by without a model (process group,
    threads, the trainer)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)

    def parallel_plan(self):  # noqa: ANN201
        from zoo.plan import ModelPlan

        return ModelPlan(blocks=("linear",))

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.mse_loss(self.linear(inputs), labels)}


class _ConvBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.conv = nn.Conv1d(width, width, kernel_size=4, padding=3, groups=width)
        self.gate, self.value, self.out = nn.Linear(width, 2 * width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.norm(hidden)
        x = self.conv(x.transpose(1, 2))[..., : hidden.shape[1]].transpose(1, 2)
        return hidden + self.out(F.silu(self.gate(x)) * self.value(x))


def build(family: str, size: str) -> nn.Module:
    """The `family` model at `size` (seeded)."""
    torch.manual_seed(0)
    layers, width = WIDTHS[size]
    heads = 4
    if family == "gpt":
        from nlp.gpt import GPT, GPTConfig

        return GPT(GPTConfig(vocab_size=4096, block_size=256, n_layer=layers, n_head=heads, n_embd=width))
    if family == "bert":
        from nlp.bert import Bert, BertConfig

        return Bert(BertConfig(vocab_size=4096, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                               intermediate_size=4 * width, max_position_embeddings=256, head="mlm"))
    if family == "vit":
        from vision.vit import ViT, ViTConfig

        return ViT(ViTConfig(image_size=32, patch_size=4, num_channels=3, hidden_size=width, num_hidden_layers=layers,
                             num_attention_heads=heads, intermediate_size=4 * width, num_labels=10))
    if family == "conformer":
        from asr.model import Transducer, TransducerConfig

        return Transducer(TransducerConfig.sized("tiny", vocab_size=64, encoder_layers=layers, encoder_width=width,
                                                 encoder_input_dim=80, decoder_dim=width, joiner_dim=width,
                                                 loss="pruned", spec_augment=None))
    if family == "fold":
        from protein.evoformer import EvoformerConfig
        from protein.model import FoldConfig, FoldingModel
        from protein.structure_module import StructureConfig

        evoformer = EvoformerConfig(msa_dim=width // 4, pair_dim=width // 4, blocks=layers, msa_heads=4, pair_heads=4,
                                    head_dim=8, outer_product_dim=8, triangle_dim=width // 4)
        return FoldingModel(FoldConfig(evoformer=evoformer, max_recycles=0,
                                       structure=StructureConfig(single_dim=width // 2, layers=2, heads=4, head_dim=8)))
    if family == "conv_lm":
        return ConvLM(4096, width, layers)
    if family == BASELINE:
        return _Baseline()
    raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")


def example(family: str) -> tuple[dict[str, torch.Tensor], object]:
    """One example of `family` and the collate function that batches it."""
    generator = torch.Generator().manual_seed(1)
    default = torch.utils.data.default_collate
    if family in ("gpt", "conv_lm"):
        ids = torch.randint(0, 4096, (256,), generator=generator)
        return {"input_ids": ids, "labels": ids}, default
    if family == "bert":
        ids = torch.randint(5, 4096, (128,), generator=generator)
        labels = torch.where(torch.arange(128) % 7 == 3, ids, -100)
        return {"input_ids": ids, "attention_mask": torch.ones(128, dtype=torch.long), "labels": labels}, default
    if family == "vit":
        return {"pixel_values": torch.randn(3, 32, 32, generator=generator), "labels": torch.tensor(3)}, default
    if family == "conformer":
        from asr.data import collate_speech

        return {"input_features": torch.randn(400, 80, generator=generator),
                "labels": torch.randint(1, 64, (24,), generator=generator)}, collate_speech
    if family == BASELINE:
        return {"inputs": torch.randn(8, generator=generator), "labels": torch.randn(1, generator=generator)}, default
    if family == "fold":
        from protein.data import CropConfig, FoldingExamples, collate_folding, load_chains

        chains = [chain for chain in load_chains("train") if len(chain.sequence) >= 48][:1]
        return FoldingExamples(chains, CropConfig(crop_size=48, msa_rows=8, withhold_profile=0.0))[0], collate_folding
    raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")


def _trainer_config(world: int):  # noqa: ANN202
    from trainers import TrainConfig

    return TrainConfig(global_batch_size=2 * MICRO * world, micro_batch_size=MICRO, max_steps=2, lr=1e-3,
                       warmup_steps=1, log_every=100, progress=False, output_dir="/tmp/memzoo-estimate-bench")


def _measure(family: str, size: str, zero: int, recompute: str, world: int) -> dict:
    from trainers import Strategy, Trainer

    item, collate = example(family)
    before = _rss()
    trainer = Trainer(build(family, size), _trainer_config(world), Strategy(zero=zero, recompute=recompute))
    trainer.fit([item] * (4 * MICRO * world), collate_fn=collate)
    report = trainer.memory_report()[0]
    return {"family": family, "size": size, "zero": zero, "recompute": recompute,
            "measured_peak": report["peak"], "measured_activations": report["activation_peak"],
            "rss_delta": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before,
            "cuda_max_allocated": report.get("cuda_max_allocated")}


def _rss() -> int:
    """Resident set size of this process now (bytes)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(out: str, families: list[str], cases: list[str]) -> None:
    import torch.distributed as dist

    from trainers.parallel.mesh import setup_distributed

    setup_distributed()
    world = dist.get_world_size()
    rows = []
    for family in families:
        for size in SIZES:
            for zero, recompute in CASES:
                if cases and f"{family}/{size}/{zero}/{recompute}" not in cases:
                    continue
                rows.append(_measure(family, size, zero, recompute, world))
    finish_worker(out, rows)


def estimates(families: list[str], world: int) -> list[dict]:
    from trainers import Strategy
    from trainers.estimate.trace import estimate_layouts

    rows = []
    for family in families:
        item, collate = example(family)
        batch = collate([item] * MICRO)
        for size in SIZES:
            layouts = [(Strategy(zero=zero, recompute=recompute), world, _trainer_config(world)) for zero, recompute in CASES]
            for (zero, recompute), estimate in zip(CASES, estimate_layouts(functools.partial(build, family, size), batch,
                                                                           layouts)):
                rank = estimate.ranks[0]
                rows.append({"family": family, "size": size, "zero": zero, "recompute": recompute,
                             "estimated_peak": rank.peak, "estimated_activations": rank.activation_peak,
                             "estimate_seconds": estimate.seconds,
                             "parameters": sum(p.numel() for p in build(family, size).parameters())})
    return rows


def table(rows: list[dict]) -> str:
    mib = 2**20
    on_gpu = any(r.get("cuda_max_allocated") for r in rows)
    other = "cuda max allocated MiB" if on_gpu else "RSS growth less baseline MiB (L)"
    lines = ["| model | size | parameters | ZeRO | recompute | estimated peak MiB | measured peak MiB | estimate / measured "
             f"| {other} | estimate / that |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if on_gpu:
            rss = r["cuda_max_allocated"]
        else:
            rss = r["rss_delta"] - r["baseline_rss_delta"] if r.get("rss_delta") else None
        lines.append(f"| {r['family']} | {r['size']} | {r['parameters'] / 1e6:.2f}M | {r['zero']} | {r['recompute']} | "
                     f"{r['estimated_peak'] / mib:.2f} | {r['measured_peak'] / mib:.2f} | "
                     f"{r['estimated_peak'] / r['measured_peak']:.3f} | "
                     + (f"{rss / mib:.1f} | {r['estimated_peak'] / rss:.2f} |" if rss else " | |"))
    ratios = [r["estimated_peak"] / r["measured_peak"] for r in rows]
    lines.append(f"\n{len(rows)} cases: estimate / measured from {min(ratios):.3f} to {max(ratios):.3f}; "
                 f"largest error {max(abs(x - 1) for x in ratios) * 100:.1f}%")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/memory_estimate.jsonl")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=[*FAMILIES, BASELINE])
    parser.add_argument("--world", type=int, default=2, help="ranks (GPUs under MEMZOO_DEVICE=cuda)")
    parser.add_argument("--reuse-measured", action="store_true",
                        help="estimate again against the measurements of the last run (OUT.measured.jsonl, OUT.rss.jsonl)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cases", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out, args.families, args.cases)
        return
    started = time.time()
    measured_file, rss_file = Path(args.out).with_suffix(".measured.jsonl"), Path(args.out).with_suffix(".rss.jsonl")
    device = os.environ.get("MEMZOO_DEVICE", "cpu")
    environment = {"MEMZOO_DEVICE": device}
    if args.reuse_measured:
        measured = [json.loads(line) for line in measured_file.read_text().splitlines()]
        rss = {row["case"]: row["rss_delta"] for row in map(json.loads, rss_file.read_text().splitlines())}
    else:
        measured = launch_ranks(__file__, [args.world], str(measured_file), ["--families", *args.families], environment)
        rss = {}
        for family in [BASELINE, *args.families] if device == "cpu" else []:  # a fresh process per case: its own peak RSS
            for zero, recompute in CASES:
                case = f"{family}/L/{zero}/{recompute}"
                rss[case] = launch_ranks(__file__, [args.world], str(rss_file) + ".tmp", ["--families", family, "--cases", case],
                                         {**environment, **RETURN_FREED_BLOCKS})[0]["rss_delta"]
        rss_file.write_text("".join(json.dumps({"case": case, "rss_delta": delta}) + "\n" for case, delta in rss.items()))
    by_case = {(r["family"], r["size"], r["zero"], r["recompute"]): r for r in measured}
    rows = []
    for estimate in estimates(args.families, args.world):
        key = (estimate["family"], estimate["size"], estimate["zero"], estimate["recompute"])
        row = {**by_case[key], **estimate}
        if key[1] == "L" and rss:
            row["rss_delta"] = rss["/".join(map(str, key))]
            row["baseline_rss_delta"] = rss[f"{BASELINE}/L/{key[2]}/{key[3]}"]
        else:
            row["rss_delta"] = None
        rows.append(row)
    with open(args.out, "w") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
    print(f"device: {ranks_device()}; torch {torch.__version__}; {time.time() - started:.0f} s\n")
    print(table(rows))


if __name__ == "__main__":
    main()
