"""The gpt_moe recipe: its dense twin runs as many feed-forward parameters a token as the sparse
model, and a few steps of both write the sparse model with a card holding both validation losses
and the experts' load."""

from __future__ import annotations

import re

import pytest

import zoo
from recipes.gpt_moe import GPTMoEConfig, active_feed_forward_parameters, dense_twin, run
from zoo.recipes import apply_overrides, parse_overrides


def test_the_dense_twin_runs_the_sparse_model_s_active_parameters():
    sparse = GPTMoEConfig().sparse
    assert active_feed_forward_parameters(sparse) == active_feed_forward_parameters(dense_twin(sparse)) == 294_912
    with pytest.raises(ValueError, match="sparse.n_experts must be >= 1"):
        apply_overrides(GPTMoEConfig(), parse_overrides(["--sparse.n_experts", "0"]))


@pytest.mark.timeout(300)
def test_a_short_run_writes_the_sparse_model_with_both_losses_and_the_load(tmp_path):
    config = apply_overrides(GPTMoEConfig(), parse_overrides([
        "--sparse.n_layer", "2", "--sparse.n_embd", "48", "--sparse.n_head", "2", "--sparse.moe_hidden", "64",
        "--sparse.block_size", "32", "--train.max_steps", "4", "--train.global_batch_size", "8",
        "--train.micro_batch_size", "4", "--train.eval_every", "4", "--train.eval_batches", "2",
        "--train.warmup_steps", "1", "--train.progress", "false", "--train.output_dir", str(tmp_path / "run"),
        "--output", str(tmp_path / "model")]))
    results = run(config)
    assert set(results) == {"dense", "sparse"} and results["sparse"]["validation_loss"] != results["dense"]["validation_loss"]
    load = results["sparse"]["expert_load"]["layers"]
    assert len(load) == 2 and all(layer["micro_batches"] == 4 * 2 for layer in load)  # 4 steps x 2 micro batches
    assert all(abs(sum(layer["share"]) - 1) < 1e-3 and 0 <= layer["min_share"] <= layer["max_share"] <= 1
               for layer in load)
    card = (tmp_path / "model" / "README.md").read_text()
    for name in ("sparse", "dense"):
        assert re.search(rf"\| {name} \| {results[name]['validation_loss']:.4f} \|", card)
    assert "zoo train gpt_moe" in card and card.count("\n| 0 |") == 1
    model = zoo.load(tmp_path / "model")
    assert model.config.n_experts == 8 and model.config.n_layer == 2
