"""The `zoo` command line, run as a user runs it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import zoo_in_process
from zoo.model_folder import CARD_FILE

ZOO = str(Path(sys.executable).parent / "zoo")  # the console script installed beside this python


def zoo_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([ZOO, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_list_and_info_show_the_shipped_model(capsys):
    listing = zoo_cli("list")
    assert listing.returncode == 0, listing.stderr
    assert "gpt-shakespeare-char" in listing.stdout and "recipe gpt_shakespeare" in listing.stdout
    models = [line for line in listing.stdout.splitlines() if not line.startswith("recipe ")]
    recipes = [line for line in listing.stdout.splitlines() if line.startswith("recipe ")]
    assert len({line.index(" /") for line in models}) == 1  # the folders in one column, however long a name
    assert len({line.index(" -> ") for line in recipes}) == 1
    info = zoo_in_process(capsys, "info", "gpt-shakespeare-char")
    assert "zoo train gpt_shakespeare" in info.stdout and "perplexity" in info.stdout


IMPORTED_DOMAINS = """
import sys
from zoo.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(sorted({name.split(".")[0] for name in sys.modules} & {"nlp", "vision", "asr", "protein", "recipes"}),
      "recipes.fold_tiny" in sys.modules)
"""
"""Runs `zoo ARGS` in a fresh interpreter and prints the domain packages it imported."""


@pytest.mark.parametrize(("args", "expected"), [(["fold", "--help"], "['protein'] False"),
                                                (["--log-level", "info", "train", "fold_tiny", "--help"],
                                                 "['protein', 'recipes'] True")])
def test_a_verb_imports_only_the_domain_it_runs(args, expected):
    """Each domain's command line and recipe loads on its own (about a second each): a verb
    imports its own domain alone."""
    done = subprocess.run([sys.executable, "-c", IMPORTED_DOMAINS, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == expected


def test_generate_continues_the_prompt_reproducibly(capsys):
    first = zoo_cli("generate", "gpt-shakespeare-char", "ROMEO.", "--tokens", "60", "--seed", "3")
    second = zoo_in_process(capsys, "generate", "gpt-shakespeare-char", "ROMEO.", "--tokens", "60", "--seed", "3")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert first.stdout.startswith("ROMEO.") and len(first.stdout.strip()) == len("ROMEO.") + 60


def test_train_help_lists_every_option_with_type_default_and_docstring(capsys):
    result = zoo_in_process(capsys, "train", "gpt_shakespeare", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: zoo train gpt_shakespeare" in result.stdout
    assert "--strategy.zero {0 | 1 | 2 | 3}  (default: 3)" in result.stdout
    assert "--train.max_steps {int}  (default: " in result.stdout
    assert "Optimizer steps to run (counting from step 0, also when resuming)." in result.stdout
    assert "--model.n_kv_head {int or none}  (default: None)" in result.stdout


@pytest.mark.parametrize("flag, suggestion", [("--train.max_step", "--train.max_steps"), ("--max_steps", "--train.max_steps"),
                                              ("--strategy.zeroo", "--strategy.zero")])
def test_a_misspelled_option_is_refused_with_the_closest_names(capsys, flag, suggestion):
    result = zoo_in_process(capsys, "train", "gpt_shakespeare", flag, "3")
    assert result.returncode == 2
    assert f"zoo: error: unknown option {flag}; did you mean {suggestion}" in result.stderr


def test_bad_override_is_reported_without_a_traceback(capsys):
    result = zoo_in_process(capsys, "train", "gpt_shakespeare", "--strategy.zero", "4")
    assert result.returncode == 2
    assert "zoo: error: --strategy.zero must be one of [0, 1, 2, 3]; got '4'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("tokenizer,zero,vocab,parallel", [
    ("char", "3", 84, ("--compile", "blocks")), ("gpt2", "1", 50257, ()),
    ("char", "3", 84, ("--tp", "2", "--sequence-parallel")),  # 84 characters: 42 vocabulary rows a rank
])
def test_train_on_two_ranks_writes_a_loadable_model(tmp_path, capsys, tokenizer, zero, vocab, parallel):
    out = tmp_path / "gpt"
    result = zoo_cli("train", "gpt_shakespeare", "--nproc", "2", *parallel, "--tokenizer", tokenizer, "--strategy.zero", zero,
                     "--strategy.precision", "bf16",  # the default, "auto", is fp32 on a CPU without native bf16
                     "--train.max_steps", "4", "--train.eval_batches", "2", "--train.progress", "false",
                     "--train.output_dir", str(tmp_path / "run"), "--model.n_layer", "1", "--model.n_embd", "32",
                     "--model.block_size", "32", "--sample_tokens", "20", "--output", str(out), timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "validation perplexity" in result.stdout and "| ZeRO paper |" in result.stdout
    assert "| rank | parameters MiB | gradients MiB | optimizer MiB | other MiB | activation_peak MiB | peak MiB |" in result.stdout
    assert "Under bf16 the paper counts 2 bytes a parameter" in result.stdout  # the recipe trains in bf16
    # What happens is logged once, by rank 0: the data, the run, each logged step and the checkpoint-free finish.
    assert result.stderr.count("rank 0 recipes.gpt_shakespeare INFO: Shakespeare: ") == 1
    assert result.stderr.count("rank 0 trainers INFO: training GPT (") == 1
    assert "rank 0 trainers INFO: step 4/4 loss" in result.stderr and "rank 1 trainers INFO" not in result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["tokenizer"]["kind"] == tokenizer and config["metrics"]["steps"] == 4
    assert config["config"]["vocab_size"] == vocab
    metrics = config["metrics"]
    assert 1.0 < metrics["validation_perplexity"] < 2 * vocab
    # bits per character = nats per token / (characters per token x ln 2); one character per token for "char"
    if tokenizer == "char":
        assert abs(metrics["validation_bits_per_character"] - metrics["validation_loss"] / 0.6931471805599453) < 1e-9
    else:
        assert 0.1 * metrics["validation_loss"] < metrics["validation_bits_per_character"] < metrics["validation_loss"]
    generated = zoo_in_process(capsys, "generate", str(out), "KING.", "--tokens", "10")
    assert generated.returncode == 0 and generated.stdout.startswith("KING.")
    if parallel:  # the card's command reproduces the layout
        expected = "--strategy.compile blocks" if "--compile" in parallel else "--strategy.tp 2 --strategy.sequence_parallel true"
        assert expected in (out / CARD_FILE).read_text()


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_train_with_tiered_memory_on_two_ranks_writes_a_loadable_model(tmp_path, capsys):
    """`--offload chunks --offload-dir DIR --memory 2GiB --device-memory 256MiB` (ZeRO-3 over
    chunks, the recipe's stage; off a GPU the device tier a pool of host memory): each rank's chunk
    files under DIR removed when the ranks exit (through `exit_process`, which skips `atexit`), the
    model saved whole and generating, the card's command naming the tiered strategy."""
    out = tmp_path / "gpt"
    result = zoo_cli("train", "gpt_shakespeare", "--nproc", "2", "--offload", "chunks", "--offload-dir",
                     str(tmp_path / "chunks"), "--memory", "2GiB", "--device-memory", "256MiB",
                     "--swap-activations", "4KiB", "--strategy.zero", "3",
                     "--strategy.precision", "fp32", "--tokenizer", "char", "--train.max_steps", "4",
                     "--train.eval_batches", "2", "--train.progress", "false", "--train.output_dir", str(tmp_path / "run"),
                     "--model.n_layer", "1", "--model.n_embd", "32", "--sample_tokens", "20", "--output", str(out),
                     timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "With offload='chunks' the model states live in chunks" in result.stdout
    assert (tmp_path / "chunks").is_dir() and not list((tmp_path / "chunks").rglob("*"))
    assert 1.0 < json.loads((out / "config.json").read_text())["metrics"]["validation_perplexity"] < 2 * 84
    generated = zoo_in_process(capsys, "generate", str(out), "KING.", "--tokens", "10")
    assert generated.returncode == 0 and generated.stdout.startswith("KING.")
    card = (out / CARD_FILE).read_text()
    assert "--strategy.offload chunks" in card and "--strategy.swap_activations 4096" in card
    assert "--strategy.device_memory_budget 268435456" in card


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_train_a_pipeline_on_four_ranks_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "gpt"
    result = zoo_cli("train", "gpt_shakespeare", "--nproc", "4", "--pp", "2", "--pp-schedule", "looped_bfs",
                     "--microbatches", "4", "--train.max_steps", "3", "--train.eval_batches", "2",
                     "--train.progress", "false", "--train.output_dir", str(tmp_path / "run"), "--model.n_layer", "2",
                     "--model.n_embd", "32", "--sample_tokens", "20", "--output", str(out), timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    # pp=2 x dp=2: each data-parallel rank's 16 examples of the 32-example step cut into 4 micro batches of 4.
    card = (out / CARD_FILE).read_text()
    assert "--train.micro_batch_size 4" in card and "--strategy.pp 2 --strategy.pp_schedule looped_bfs" in card
    assert "rank 0 trainers INFO: step 3/3 loss" in result.stderr
    assert 1.0 < json.loads((out / "config.json").read_text())["metrics"]["validation_perplexity"] < 2 * 84
    generated = zoo_in_process(capsys, "generate", str(out), "KING.", "--tokens", "10")
    assert generated.returncode == 0 and generated.stdout.startswith("KING.")


def test_export_writes_a_folder_transformers_loads(tmp_path):
    import torch
    import transformers

    import zoo

    result = zoo_cli("export", "gpt-shakespeare-char", str(tmp_path / "hf"))
    assert result.returncode == 0, result.stderr
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ours = zoo.load("gpt-shakespeare-char")
    ids = torch.tensor([[30, 41, 52, 63, 7]])
    with torch.no_grad():
        assert torch.allclose(theirs(ids).logits, ours(ids)["logits"], rtol=1e-5, atol=1e-5)
    assert zoo.load(tmp_path / "hf").config.n_embd == 128


def write_bad_inputs(tmp_path: Path) -> dict[str, Path]:
    """A text file named like an image, a model folder with a truncated and one with a missing weights file."""
    import shutil

    from zoo.store import locate

    not_image = tmp_path / "digit.png"
    not_image.write_text("not an image")
    truncated, missing = tmp_path / "truncated", tmp_path / "missing"
    for folder in (truncated, missing):
        shutil.copytree(locate("vit-digits"), folder)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (missing / "model.safetensors").unlink()
    return {"not_image": not_image, "truncated": truncated, "missing": missing}


@pytest.mark.sequential  # the planner's fresh tracing process: balances make test's sessions
def test_plan_prints_layouts_that_fit_with_their_train_flags(capsys):
    result = zoo_in_process(capsys, "plan", "gpt-shakespeare-char", "--nproc", "2", "--memory", "48MiB",
                            "--micro-batch-size", "4", "--max-traces", "2")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows, result.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert 0 < float(cells[1]) <= 48 and "peak MiB" in result.stdout
        assert cells[-1].startswith("`--nproc 2 ") and "--strategy.zero" in cells[-1]


@pytest.mark.sequential
@pytest.mark.parametrize("arch, fields", [("transducer", ("--encoder.layers", "1")),
                                          ("fold", ("--evoformer.blocks", "1", "--max_recycles", "0",
                                                    "--structure.layers", "1"))])
def test_plan_traces_the_example_batch_of_each_architecture(arch, fields, capsys):
    result = zoo_in_process(capsys, "plan", arch, "--nproc", "2", "--memory", "4GiB", "--max-traces", "1", *fields)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 1, result.stdout
    mib = 1024 if "| peak GiB |" in result.stdout else 1  # the table's unit: GiB once a peak reaches one
    peaks = [float(row.strip("|").split("|")[1]) * mib for row in rows]
    assert all(0 < peak <= 4 * 1024 for peak in peaks), result.stdout


@pytest.mark.sequential  # the planner's fresh tracing process: balances make test's sessions
def test_plan_reads_a_transformers_folder_under_the_plans_transformers_ships(tmp_path, capsys):
    """A Gemma 3 folder (its config.json only: the weights are not read) planned as transformers' own
    class, 2 rows of 64 tokens, on 2 ranks under 48 MiB each: every layout printed fits; and a head
    the command makes no micro batch for is named."""
    import transformers

    from library_models import LIBRARY_MODELS

    config = LIBRARY_MODELS["gemma3"][0]().config
    config.architectures = ["Gemma3ForCausalLM"]
    config.save_pretrained(tmp_path / "gemma3")
    result = zoo_in_process(capsys, "plan", str(tmp_path / "gemma3"), "--nproc", "2", "--memory", "48MiB",
                            "--micro-batch-size", "2", "--sequence-length", "64", "--max-traces", "2")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows and all(0 < float(row.strip("|").split("|")[1]) <= 48 for row in rows), result.stdout
    transformers.Gemma3TextConfig(architectures=["Gemma3ForSequenceClassification"]).save_pretrained(tmp_path / "scores")
    result = zoo_in_process(capsys, "plan", str(tmp_path / "scores"), "--nproc", "1", "--memory", "1GiB")
    assert result.returncode != 0
    assert "Gemma3ForSequenceClassification: a micro batch is made for heads ending in ForCausalLM" in result.stderr


def test_plan_of_an_architecture_without_an_example_batch_says_so():
    from trainers.commands.plan import cmd_plan
    from zoo.registry import register

    @dataclasses.dataclass
    class NoBatchConfig:
        """A config."""

        width: int = 4
        """Features."""

    @register("test-no-example-batch", NoBatchConfig)
    class NoBatch(torch.nn.Linear):
        def __init__(self, config: NoBatchConfig) -> None:
            super().__init__(config.width, config.width)

    args = argparse.Namespace(model="test-no-example-batch", nproc=2, memory="1GiB", device="cpu", micro_batch_size=1,
                              global_batch_size=None, sequence_length=1024, top=1, max_traces=1)
    with pytest.raises(ValueError, match=r"architecture 'test-no-example-batch' has no example_batch\(config, rows\)"):
        cmd_plan(args, {})


def test_bad_inputs_end_in_one_clear_line(tmp_path, capsys):
    bad = write_bad_inputs(tmp_path)
    cases = [
        (("classify", "vit-digits", str(bad["not_image"])), "is not a readable image"),
        (("classify", "vit-digits", str(tmp_path / "absent.png")), "absent.png' does not exist"),
        (("classify", str(bad["truncated"]), str(bad["not_image"])), "model.safetensors' is damaged or not a safetensors file"),
        (("classify", str(bad["missing"]), str(bad["not_image"])), "model.safetensors' is missing"),
        (("fold", "fold-tiny", "MKTAYIAKQR", "-o", str(tmp_path / "absent" / "out.pdb")), "absent' does not exist"),
        (("fold", "fold-tiny", "MKTAYIAKQR", "-o", str(tmp_path / "out.pdb"), "--recycles", "-3"),
         "recycles must be an int >= 0 (or None for the model's own); got -3"),
        (("train", "gpt_shakespeare", "--nproc", "-3"), "--nproc must be >= 1; got -3"),
        (("train", "gpt_shakespeare", "--nproc", "3", "--tp", "2"),
         "--nproc 3 must be a multiple of the tensor-parallel degree --tp 2"),
        (("train", "gpt_shakespeare", "--nproc", "3", "--pp", "2"), "--nproc 3 must be a multiple of --pp 2 x --tp 1 = 2"),
        (("train", "gpt_moe", "--nproc", "3", "--ep", "2"),
         "--ep 2 must divide the data-parallel ranks, --nproc 3 / (--pp 1 x --tp 1) = 3"),
        (("train", "gpt_shakespeare", "--nproc", "2", "--pp", "2", "--pp-schedule", "interleaved_1f1b"),
         "Strategy.pp_schedule='interleaved_1f1b' runs several stages per rank and needs Strategy.stages_per_rank > 1"),
        (("train", "gpt_shakespeare", "--nproc", "2", "--pp", "2", "--microbatches", "5"),
         "--microbatches 5 must divide each data-parallel rank's share of --train.global_batch_size 32: 32 examples"),
        (("train", "gpt_shakespeare", "--nproc", "2", "--pp", "2", "--strategy.microbatches", "3"),
         "Strategy.microbatches=3 must divide the micro batches of each step and data-parallel rank"),
        (("train", "gpt_shakespeare", "--nproc", "2", "--sequence-parallel"),
         "Strategy.sequence_parallel=True splits activations over the tensor-parallel ranks and needs Strategy.tp > 1"),
        (("plan", "gpt", "--nproc", "2", "--memory", "six"),
         "memory_budget must be a positive number of bytes or a string with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"),
        (("plan", "gpt", "--nproc", "2", "--memory", "1GiB", "--device", "tpu"),
         "device must be one of 'h100', 'a100', 'cpu' or a trainers.DeviceSpec; got 'tpu'"),
        (("plan", "bert", "--nproc", "2", "--memory", "1GiB", "--head", "none"),
         "BertConfig.head='none' has no training loss; a plan needs 'mlm' or 'classification'"),
        (("plan", "gpt", "--nproc", "2", "--memory", "1GiB", "--n_layers", "3"), "unknown option --n_layers"),
        (("train", "gpt_shakespeare", "--nproc", "1", "--train.micro_batch_size", "12"),
         "--nproc 1: TrainConfig.global_batch_size must be divisible by micro_batch_size x data-parallel ranks (12 x 1 = 12); got 32"),
    ]
    # The first through the console script, the others through its main in this process.
    results = [zoo_cli(*cases[0][0])] + [zoo_in_process(capsys, *args) for args, _ in cases[1:]]
    for (args, message), result in zip(cases, results, strict=True):
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("zoo: error: ") and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_more_ranks_than_cores_warns_and_a_batch_that_does_not_split_stops_before_launching():
    ranks = (os.cpu_count() or 1) + 1
    result = zoo_cli("train", "gpt_shakespeare", "--nproc", str(ranks), "--train.micro_batch_size", "7")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"zoo: warning: --nproc {ranks} is more than this machine's") and "share them" in lines[0]
    assert lines[1:] == [f"zoo: error: --nproc {ranks}: TrainConfig.global_batch_size must be divisible by "
                         f"micro_batch_size x data-parallel ranks (7 x {ranks} = {7 * ranks}); got 32"]  # once, no rank started
