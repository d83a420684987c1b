"""Saved-activation bytes and step time of zoo.nn transformer blocks against the Hugging Face layers
of the same configuration (BertLayer, GPT2Block, ViTLayer), in one run; on a GPU also each Triton
kernel against its PyTorch path and `torch.compile`.

    python benchmarks/fused_layers.py [--device cpu|cuda] [--dtype float32|bfloat16] [--skip-time]

Saved bytes: the distinct storages autograd keeps for backward through a stack of two blocks
(`trainers.memory.saved_activations.SavedActivations`, parameters excluded), divided by two, in MiB. The
block input counts for both sides; a tensor two operations save counts once. Both sides train with
their configuration's dropouts (HF defaults: BERT and GPT-2 0.1 everywhere, ViT none); the
no-dropout rows show the gap when attention dropout is off. Step time: forward + backward of a
stack of `--layers` blocks at half the batch, median of `--repeats` after one warm-up, HF and ours
run in turn.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from trainers.memory.saved_activations import SavedActivations
from zoo.nn.activation import activate, bias_act_dropout
from zoo.nn.block import TransformerBlock, TransformerBlockConfig

warnings.filterwarnings("ignore")


@dataclass
class Case:
    name: str
    batch: int
    length: int
    ours: TransformerBlockConfig
    dropout: float
    attention_dropout: float


def hf_layer(case: Case) -> nn.Module:
    """The Hugging Face layer of `case`, with SDPA attention (its leanest implementation)."""
    from transformers import BertConfig, GPT2Config, ViTConfig
    from transformers.models.bert.modeling_bert import BertLayer
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    from transformers.models.vit.modeling_vit import ViTLayer

    if case.name.startswith("bert"):
        config = BertConfig(hidden_dropout_prob=case.dropout, attention_probs_dropout_prob=case.attention_dropout)
        layer_class = BertLayer
    elif case.name.startswith("gpt2"):
        config = GPT2Config(resid_pdrop=case.dropout, attn_pdrop=case.attention_dropout)
        layer_class = GPT2Block
    else:
        config = ViTConfig(hidden_dropout_prob=case.dropout, attention_probs_dropout_prob=case.attention_dropout)
        layer_class = ViTLayer
    config._attn_implementation = "sdpa"
    return layer_class(config)


def call(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = layer(x)
    return out[0] if isinstance(out, tuple) else out


def cases() -> list[Case]:
    bert = TransformerBlockConfig(prenorm=False, activation="gelu", eps=1e-12, dropout=0.1, attention_dropout=0.1)
    gpt2 = TransformerBlockConfig(prenorm=True, causal=True, activation="gelu_tanh", dropout=0.1, attention_dropout=0.1)
    vit = TransformerBlockConfig(prenorm=True, activation="gelu", eps=1e-12)
    return [
        Case("bert-base", 4, 512, bert, 0.1, 0.1),
        Case("bert-base, no attention dropout", 4, 512, replace(bert, attention_dropout=0.0), 0.1, 0.0),
        Case("gpt2-small", 4, 1024, gpt2, 0.1, 0.1),
        Case("gpt2-small, no attention dropout", 4, 1024, replace(gpt2, attention_dropout=0.0), 0.1, 0.0),
        Case("vit-base/16", 16, 197, vit, 0.0, 0.0),
    ]


def saved_bytes_per_block(blocks: list[nn.Module], x: torch.Tensor) -> int:
    with SavedActivations(exclude=[p for b in blocks for p in b.parameters()]) as saved:
        h = x
        for block in blocks:
            h = call(block, h)
    return saved.bytes // len(blocks)


def step_seconds(stacks: dict[str, nn.Module], x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Median forward + backward seconds of each stack, the stacks run in turn (after one warm-up
    round) so that load on the machine affects all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in stacks}
    for index in range(repeats + 1):
        for name, blocks in stacks.items():
            if x.is_cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            h = x
            for block in blocks:
                h = call(block, h)
            h.float().square().mean().backward()
            if x.is_cuda:
                torch.cuda.synchronize()
            if index:
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def block_table(device: str, dtype: torch.dtype, layers: int, repeats: int, skip_time: bool) -> None:
    print(f"| block (B x S) | HF saved MiB/block | ours | ratio | ours, recompute_attention | ratio |"
          f"{'' if skip_time else ' HF step s | ours step s | speed-up |'}")
    print(f"|---|---|---|---|---|---|{'' if skip_time else '---|---|---|'}")
    for case in cases():
        torch.manual_seed(0)
        x = torch.randn(case.batch, case.length, case.ours.width, device=device, dtype=dtype, requires_grad=True)
        build = {
            "hf": lambda: hf_layer(case),
            "ours": lambda: TransformerBlock(case.ours),
            "recompute": lambda: TransformerBlock(replace(case.ours, recompute_attention=True)),
        }
        saved = {}
        for name, make in build.items():
            blocks = nn.ModuleList(make() for _ in range(2)).to(device, dtype).train()
            saved[name] = saved_bytes_per_block(list(blocks), x) / 2**20
        row = (f"| {case.name} ({case.batch} x {case.length}) | {saved['hf']:.1f} | {saved['ours']:.1f} | "
               f"{saved['ours'] / saved['hf']:.2f}x | {saved['recompute']:.1f} | {saved['recompute'] / saved['hf']:.2f}x |")
        if not skip_time and "no attention" not in case.name:
            small = x[: max(1, case.batch // 2)].detach().requires_grad_()
            stacks = {name: nn.ModuleList(build[name]() for _ in range(layers)).to(device, dtype).train()
                      for name in ("hf", "ours")}
            timed = step_seconds(stacks, small, repeats)
            row += f" {timed['hf']:.3f} | {timed['ours']:.3f} | {timed['hf'] / timed['ours']:.2f}x |"
        elif not skip_time:
            row += " | | |"
        print(row, flush=True)


def derivative_error_table() -> None:
    """Relative error of the input gradient when act' is stored in bfloat16 (float64 reference)."""
    print("\n| activation | saved input (fp32) | saved derivative (fp32) | saved derivative (bf16) |")
    print("|---|---|---|---|")
    x64 = torch.randn(1 << 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    for activation in ("gelu", "gelu_tanh", "silu", "relu"):
        reference = torch.func.grad(lambda t: activate(t, activation).sum())(x64)
        cells = []
        for save, dtype in (("input", None), ("derivative", None), ("derivative", torch.bfloat16)):
            x = x64.float().requires_grad_()
            bias_act_dropout(x, None, activation, save=save, derivative_dtype=dtype).sum().backward()
            cells.append(f"{((x.grad.double() - reference).norm() / reference.norm()).item():.1e}")
        print(f"| {activation} | " + " | ".join(cells) + " |")


def kernel_table(dtype: torch.dtype, repeats: int) -> None:
    """GPU only: each Triton kernel against its PyTorch path and torch.compile of the plain PyTorch
    expression it replaces (ms per forward + backward)."""
    from zoo.nn.cross_entropy import linear_cross_entropy
    from zoo.nn.norm import dropout_add_norm

    rows, width = 16384, 768
    x = torch.randn(rows, width, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.ones(width, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.zeros(width, device="cuda", dtype=dtype, requires_grad=True)
    h = torch.randn(rows, 4 * width, device="cuda", dtype=dtype, requires_grad=True)
    bias = torch.zeros(4 * width, device="cuda", dtype=dtype, requires_grad=True)
    hidden = torch.randn(4096, width, device="cuda", dtype=dtype, requires_grad=True)
    vocab = torch.randn(50257, width, device="cuda", dtype=dtype, requires_grad=True)
    labels = torch.randint(0, 50257, (4096,), device="cuda")
    fused = {
        "dropout+residual+LayerNorm": lambda backend: dropout_add_norm(x, r, w, b, p=0.1, backend=backend),
        "bias+GELU+dropout": lambda backend: bias_act_dropout(h, bias, "gelu", 0.1, backend=backend),
        "linear+cross-entropy (4096 x 50257)": lambda backend: linear_cross_entropy(hidden, vocab, labels,
                                                                                   backend=backend),
    }
    plain = {  # what torch.compile fuses from the unfused PyTorch expression
        "dropout+residual+LayerNorm": lambda: F.layer_norm(F.dropout(x, 0.1) + r, (width,), w, b),
        "bias+GELU+dropout": lambda: F.dropout(F.gelu(h + bias), 0.1),
        "linear+cross-entropy (4096 x 50257)": lambda: F.cross_entropy((hidden @ vocab.T).float(), labels),
    }
    print(f"\n| kernel ({rows} x {width}, {dtype}) fwd+bwd ms | Triton | PyTorch path | torch.compile(plain PyTorch) |")
    print("|---|---|---|---|")
    for name, op in fused.items():
        compiled = torch.compile(plain[name])
        cells = []
        for run in (lambda op=op: op("triton"), lambda op=op: op("torch"), compiled):
            try:
                for index in range(repeats + 3):
                    if index == 3:
                        torch.cuda.synchronize()
                        started = time.perf_counter()
                    run().float().sum().backward()
                torch.cuda.synchronize()
                cells.append(f"{(time.perf_counter() - started) / repeats * 1e3:.3f}")
            except Exception as error:  # a benchmark cell that fails is reported, not fatal
                cells.append(f"failed: {type(error).__name__}")
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-time", action="store_true")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"device: {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, dtype {args.dtype}, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    block_table(args.device, dtype, args.layers, args.repeats, args.skip_time)
    derivative_error_table()
    if args.device == "cuda":
        kernel_table(dtype, 20)


if __name__ == "__main__":
    main()
