"""GPT with mixture-of-experts blocks (`GPTConfig.n_experts`): which blocks route, the loss with
the experts' auxiliary loss, training through the Trainer, and its refusals."""

from __future__ import annotations

import pytest
import torch

from helpers import lm_examples
from nlp.gpt import GPT, GPTConfig
from nlp.hf import gpt_to_hf
from trainers import Strategy, TrainConfig, Trainer
from zoo.nn.moe import MoEFeedForward

SPARSE = GPTConfig(vocab_size=48, block_size=16, n_layer=4, n_head=2, n_embd=32, n_experts=4, moe_top_k=2, moe_every=2,
                   n_shared_experts=1, moe_hidden=48)


def test_every_moe_every_th_block_routes_and_the_loss_adds_their_auxiliary_losses():
    torch.manual_seed(0)
    model = GPT(SPARSE)
    assert [isinstance(block.mlp, MoEFeedForward) for block in model.blocks] == [False, True, False, True]
    ids = torch.stack([example["input_ids"] for example in lm_examples(4)])
    fused = model(ids, labels=ids)["loss"]
    aux = [block.aux_loss for block in model.blocks if block.aux_loss is not None]
    assert len(aux) == 2 and all(0 < value.item() < 1 for value in aux)  # 0.01 x about 1 when balanced
    unfused = model(ids, labels=ids, skip_logits=False)
    logits = unfused["logits"]
    cross_entropy = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert abs(fused.item() - (cross_entropy + sum(aux)).item()) < 1e-5
    fused.backward()
    moe = model.blocks[1].mlp
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (*moe.experts.parameters(), moe.router.weight))


@pytest.mark.timeout(120)
def test_a_sparse_gpt_learns_a_pattern_through_the_trainer_with_zero_3(tmp_path):
    torch.manual_seed(0)
    config = TrainConfig(global_batch_size=8, micro_batch_size=4, max_steps=30, lr=1e-2, warmup_steps=2, log_every=1,
                         progress=False, output_dir=str(tmp_path / "run"))
    trainer = Trainer(GPT(SPARSE), config, Strategy(zero=3, recompute="blocks"))
    history = trainer.fit(lm_examples(64))
    assert history[-1]["loss"] < 0.5 * history[0]["loss"], [record["loss"] for record in history]


def test_bad_expert_settings_and_a_gpt2_export_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"GPTConfig.moe_top_k must be between 1 and n_experts=4 .* got moe_top_k=5"):
        GPTConfig(n_experts=4, moe_top_k=5)
    with pytest.raises(ValueError, match=r"GPTConfig.moe_every must be between 1 and n_layer=2; got 3"):
        GPTConfig(n_layer=2, n_experts=4, moe_every=3)
    with pytest.raises(ValueError, match=r"GPT-2 has .* dense feed-forwards .* this GPT has .* n_experts=4"):
        gpt_to_hf(GPT(SPARSE), tmp_path / "hf")
