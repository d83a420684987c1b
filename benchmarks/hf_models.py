"""Training-step time and peak memory of our GPT-2-small, BERT-base, ViTs and transformer-base
translator against Hugging Face transformers (`GPT2LMHeadModel`, `BertForMaskedLM`,
`ViTForImageClassification`, `MarianMTModel`), same weights, same inputs, same precision.

    python benchmarks/hf_models.py [--device cpu|cuda] [--dtype float32|bfloat16] [--steps 3] [--models ...]
                                   [--loss-gradients forward|backward|both] [--rounds 1]

Each (model, implementation) runs in a fresh process, so that peak memory is its own: on CPU the
peak resident set (VmHWM, reset through /proc/self/clear_refs) above the resident set once the
model and AdamW's state exist, with glibc returning freed buffers (fixed mmap threshold); on CUDA
`torch.cuda.max_memory_allocated` above the allocation at that point. Gradients count on both sides. The step is forward
(train mode, the HF default dropouts of 0.1), loss, backward and an AdamW step; its time is the
median of `--steps` steps after one warm-up (with `--rounds` R, the median of R such processes per
implementation, the implementations run in turns: this machine's speed drifts within a minute). Saved-activation bytes of one forward
(`SavedActivations`, parameters excluded) are listed as well. HF runs with SDPA attention.
GPT-2: causal LM on (batch, 512) tokens, loss over all next tokens; BERT: MLM on (batch, 128)
tokens with 15% of positions labelled; ViT: classification of (batch, channels, size, size) images,
"vit-base" the ViT-B/16 of ImageNet (224 pixels, 1000 classes), "vit-digits" the shape of the
`vit-digits` model (6 ViT-S blocks, grey 56-pixel digits, 10 classes); "marian-base": a
transformer-base translator shaped as Marian (6 + 6 post-norm layers, width 512, 32,000 shared
tokens) on (batch, source length) sources and targets of that length, label-smoothed (0.1)
cross-entropy on both sides (HF's on its logits, as `Seq2SeqTrainer`'s `label_smoothing_factor` does).
`--loss-gradients` says when our fused losses form their gradients (`Strategy.loss_gradients`);
"both" runs ours twice, "ours" forming them in forward and "ours-bwd" in backward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch

from measure import status_bytes

warnings.filterwarnings("ignore")

SHAPES = {"gpt2-small": (4, 512), "bert-base": (8, 128), "vit-base": (8, 3, 224, 224), "vit-digits": (64, 1, 56, 56),
          "marian-base": (16, 64)}
VIT_CONFIGS = {"vit-base": {"num_labels": 1000},
               "vit-digits": {"image_size": 56, "patch_size": 14, "num_channels": 1, "hidden_size": 384,
                              "num_hidden_layers": 6, "num_attention_heads": 6, "intermediate_size": 1536,
                              "layer_norm_eps": 1e-6, "num_labels": 10}}


MARIAN_BASE = {"vocab_size": 32000, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
               "encoder_attention_heads": 8, "decoder_attention_heads": 8, "encoder_ffn_dim": 2048,
               "decoder_ffn_dim": 2048, "max_position_embeddings": 512, "pad_token_id": 31999,
               "decoder_start_token_id": 31999, "eos_token_id": 0}
"""transformer-base as a MarianConfig."""
LABEL_SMOOTHING = 0.1

GPT2_SIZES = {"gpt2-small": {}, "gpt2-medium": {"n_embd": 1024, "n_layer": 24, "n_head": 16}}
"""GPT-2 configurations by name: small (124M parameters, transformers' default) and medium (355M)."""


def read_saved(hf, importer):
    """`importer(folder)` of the HF model saved in a temporary folder: our importers read the names
    a folder stores."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        return importer(folder)


def build(model_name: str, implementation: str):
    """(model, batch builder) with HF's initialisation; ours loads the HF weights."""
    import transformers

    from nlp.bert import Bert
    from nlp.gpt import GPT
    from nlp.hf import bert_config_from_hf, bert_state_from_hf, gpt_config_from_hf, gpt_state_from_hf

    torch.manual_seed(0)
    if model_name == "marian-base":
        from nlp.translation.marian import translator_from_hf

        hf = transformers.MarianMTModel._from_config(transformers.MarianConfig(**MARIAN_BASE), attn_implementation="sdpa")
        if implementation == "hf":
            return hf
        ours = read_saved(hf, translator_from_hf)
        ours.config.label_smoothing = LABEL_SMOOTHING
        return ours
    if model_name in VIT_CONFIGS:
        from vision.hf import vit_from_hf

        config = transformers.ViTConfig(**VIT_CONFIGS[model_name])
        hf = transformers.ViTForImageClassification._from_config(config, attn_implementation="sdpa")
        return hf if implementation == "hf" else read_saved(hf, vit_from_hf)
    if model_name in GPT2_SIZES:
        config = transformers.GPT2Config(n_positions=1024, **GPT2_SIZES[model_name])
        hf = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
        if implementation == "hf":
            return hf
        ours_config = gpt_config_from_hf(config.to_dict())
        ours = GPT(ours_config)
        ours.load_state_dict(gpt_state_from_hf(hf.state_dict(), ours_config))
        return ours
    config = transformers.BertConfig(architectures=["BertForMaskedLM"])
    hf = transformers.BertForMaskedLM._from_config(config, attn_implementation="sdpa")
    if implementation == "hf":
        return hf
    ours_config = bert_config_from_hf(config.to_dict())
    ours = Bert(ours_config)
    ours.load_state_dict(bert_state_from_hf(hf.state_dict(), ours_config))
    return ours


def batch(model_name: str, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    if model_name in VIT_CONFIGS:
        shape = SHAPES[model_name]
        labels = torch.randint(0, VIT_CONFIGS[model_name]["num_labels"], shape[:1], generator=generator)
        return {"pixel_values": torch.randn(shape, generator=generator).to(device), "labels": labels.to(device)}
    size, length = SHAPES[model_name]
    if model_name == "marian-base":
        from nlp.translation.model import shift_right

        source = torch.randint(1, 31999, (size, length), generator=generator)
        labels = torch.randint(1, 31999, (size, length), generator=generator)
        start = MARIAN_BASE["decoder_start_token_id"]
        return {"input_ids": source.to(device), "attention_mask": torch.ones_like(source).to(device),
                "decoder_input_ids": shift_right(labels, start, start).to(device), "labels": labels.to(device)}
    if model_name == "gpt2-small":
        ids = torch.randint(0, 50257, (size, length + 1), generator=generator)
        return {"input_ids": ids.to(device)}
    ids = torch.randint(1000, 30522, (size, length), generator=generator)
    labels = torch.where(torch.rand(size, length, generator=generator) < 0.15, ids, -100)
    return {"input_ids": ids.to(device), "labels": labels.to(device)}


def loss_of(model, model_name: str, implementation: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    if model_name == "marian-base":
        if implementation == "ours":
            return model(**inputs)["loss"]
        logits = model(**{key: value for key, value in inputs.items() if key != "labels"}).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), inputs["labels"].flatten(),
                                                 label_smoothing=LABEL_SMOOTHING)
    if model_name in VIT_CONFIGS:
        pixel_values = inputs["pixel_values"].to(next(model.parameters()).dtype)
        output = model(pixel_values=pixel_values, labels=inputs["labels"])
        return output.loss if implementation == "hf" else output["loss"]
    if model_name == "gpt2-small":
        ids = inputs["input_ids"]
        if implementation == "hf":  # transformers shifts the labels itself
            return model(input_ids=ids[:, :-1], labels=ids[:, :-1]).loss
        return model(ids[:, :-1], labels=ids[:, :-1])["loss"]
    if implementation == "hf":
        return model(**inputs).loss
    return model(inputs["input_ids"], labels=inputs["labels"])["loss"]


def start_peak(device: torch.device) -> int:
    """Reset the peak counter; returns the memory in use now."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM, the peak resident set size
    return status_bytes("VmRSS")


def peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated() if device.type == "cuda" else status_bytes("VmHWM")


IMPLEMENTATIONS = {"forward": ("hf", "ours"), "backward": ("hf", "ours-bwd"), "both": ("hf", "ours", "ours-bwd")}
"""The implementations each `--loss-gradients` runs; "ours-bwd" is ours with the loss's gradients formed in backward."""


def worker(model_name: str, implementation: str, device_name: str, dtype_name: str, steps: int) -> dict:
    from zoo.nn.cross_entropy import loss_gradients

    with loss_gradients("backward" if implementation == "ours-bwd" else "forward"):
        return measured_steps(model_name, "ours" if implementation == "ours-bwd" else implementation, device_name,
                              dtype_name, steps)


def measured_steps(model_name: str, implementation: str, device_name: str, dtype_name: str, steps: int) -> dict:
    from trainers.memory.saved_activations import SavedActivations

    device, dtype = torch.device(device_name), getattr(torch, dtype_name)
    model = build(model_name, implementation).to(device=device, dtype=dtype).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for param in model.parameters():  # AdamW's state exists before the measured steps
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    inputs = batch(model_name, device)
    base = start_peak(device)
    times = []
    for _ in range(steps + 1):  # the first step warms up and is not timed
        started = time.perf_counter()
        loss = loss_of(model, model_name, implementation, inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    top = peak(device)
    with SavedActivations(exclude=model.parameters()) as saved:
        loss_of(model, model_name, implementation, inputs)
    return {"model": model_name, "impl": implementation, "step_s": statistics.median(times[1:]),
            "peak_above_states_mib": (top - base) / 2**20, "saved_mib": saved.bytes / 2**20, "loss": loss.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", default="gpt2-small,bert-base,vit-base,vit-digits,marian-base")
    parser.add_argument("--loss-gradients", default="forward", choices=sorted(IMPLEMENTATIONS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="processes per implementation, run in turns; the step time is the median of theirs")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "IMPL"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.device, args.dtype, args.steps)))
        return
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; dtype {args.dtype}; torch {torch.__version__}\n")
    print("| model | shape | impl | step s | peak MiB above model+optimizer | saved MiB | loss |")
    print("|---|---|---|---|---|---|---|")
    for model_name in args.models.split(","):
        runs: dict[str, list[dict]] = {implementation: [] for implementation in IMPLEMENTATIONS[args.loss_gradients]}
        for _ in range(args.rounds):
            for implementation, found in runs.items():
                command = [sys.executable, __file__, "--worker", model_name, implementation, "--device", args.device,
                           "--dtype", args.dtype, "--steps", str(args.steps)]
                # A fixed mmap threshold makes glibc return every large buffer when it is freed, so the
                # resident set follows the live tensors.
                env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
                result = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
                found.append(json.loads(result.stdout))
        rows = {implementation: {**found[0], "step_s": statistics.median(row["step_s"] for row in found)}
                for implementation, found in runs.items()}
        for implementation, row in rows.items():
            print(f"| {model_name} | {'x'.join(map(str, SHAPES[model_name]))} | {implementation} | {row['step_s']:.3f} | "
                  f"{row['peak_above_states_mib']:.0f} | {row['saved_mib']:.0f} | {row['loss']:.4f} |")
        hf = rows.pop("hf")
        for implementation, ours in rows.items():
            print(f"| {model_name} | | {implementation} / hf | {ours['step_s'] / hf['step_s']:.2f}x | "
                  f"{ours['peak_above_states_mib'] / hf['peak_above_states_mib']:.2f}x | "
                  f"{ours['saved_mib'] / hf['saved_mib']:.2f}x | |")


if __name__ == "__main__":
    main()
