"""LoRA through the Trainer (`TrainConfig(adapter=LoRA(...))`) against PEFT on transformers' Llama
built small from its config: the same initial adapters, data and optimizer give the same losses; the
adapter saved in PEFT's format loads in PEFT (and back here, and through `zoo.load(..., adapter=)`) to
the same logits; merging folds B A alpha / rank into the base; the estimator counts the adapters as
the measured step. Bad adapters are refused by name."""

from __future__ import annotations

import json

import peft
import pytest
import torch
import transformers
from torch.distributed.tensor import DTensor

import zoo
from library_models import LIBRARY_MODELS
from trainers import LoRA, Strategy, TrainConfig, Trainer, estimate_memory
from zoo.adapters import load_peft_adapter, merge_lora
from zoo.parity import relative_error



TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STEPS = 10


def llama() -> transformers.LlamaForCausalLM:
    return LIBRARY_MODELS["llama"][0]()


def examples() -> list[dict[str, torch.Tensor]]:
    return LIBRARY_MODELS["llama"][1](4)


def config(tmp_path, **settings) -> TrainConfig:
    """Constant learning rate, no clipping or decay: the reference loop below is plain AdamW."""
    return TrainConfig(**{**dict(global_batch_size=4, micro_batch_size=4, max_steps=STEPS, lr=1e-2, warmup_steps=0,
                                 min_lr_ratio=1.0, weight_decay=0.0, grad_clip=0.0, log_every=1, progress=False,
                                 measure_memory=False, output_dir=str(tmp_path)), **settings})


def peft_model(base: torch.nn.Module) -> torch.nn.Module:
    """PEFT's LoRA on `base`, its lora_B drawn at random (PEFT starts it at zero) so that the
    adapters change the outputs from the first step."""
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(TARGETS)))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model


def ours(name: str) -> str:
    """PEFT's name of an adapter parameter -> the name it has here."""
    return name.removeprefix("base_model.model.").replace(".default.", ".")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(our trainer after STEPS steps from PEFT's initial adapters, its losses, PEFT's losses)."""
    tmp_path = tmp_path_factory.mktemp("lora")
    reference = peft_model(llama())
    trainer = Trainer(llama(), config(tmp_path, adapter=LoRA(rank=4, alpha=8, targets=TARGETS)))
    own = dict(trainer.model.named_parameters())
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if param.requires_grad:  # one rank: the local tensor is the whole parameter
                target = own[ours(name)]
                (target.to_local() if isinstance(target, DTensor) else target).copy_(param)
    history = trainer.fit(examples())
    optimizer = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-2, betas=(0.9, 0.95),
                                  eps=1e-8, weight_decay=0.0)
    batch = {key: torch.stack([e[key] for e in examples()]) for key in ("input_ids", "labels")}
    losses = []
    reference.train()
    for _ in range(STEPS):
        loss = reference(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return trainer, [record["loss"] for record in history], losses, reference


def test_losses_and_adapters_match_peft_over_ten_steps(trained):
    trainer, losses, reference_losses, reference = trained
    assert len(losses) == STEPS
    errors = [abs(a - b) / abs(b) for a, b in zip(losses, reference_losses)]
    assert max(errors) < 1e-5, errors
    assert reference_losses[-1] < 0.93 * reference_losses[0]  # the adapters learn (3.91 -> 3.55)
    own = trainer.full_state_dict()
    trainable = {ours(name): p for name, p in reference.named_parameters() if p.requires_grad}
    assert {name for name, p in trainer.model.named_parameters() if p.requires_grad} == set(trainable)
    assert max(relative_error(own[name], p) for name, p in trainable.items()) < 1e-5
    # The base is frozen: no gradient, no optimizer state, unchanged.
    base = llama()
    assert all(torch.equal(own[name], p) for name, p in base.named_parameters())
    assert trainer.num_parameters() == sum(p.numel() for p in trainable.values())


def test_the_saved_adapter_loads_in_peft_and_here_to_the_same_logits(trained, tmp_path):
    trainer = trained[0]
    trainer.save_adapter(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["lora_alpha"] == 8 and sorted(saved["target_modules"]) == sorted(TARGETS)
    ids = examples()[0]["input_ids"][None]
    trainer.model.eval()
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        in_peft = peft.PeftModel.from_pretrained(llama(), tmp_path / "adapter").eval()
        assert relative_error(in_peft(input_ids=ids).logits, expected) < 1e-6
        here = llama()
        assert load_peft_adapter(here, tmp_path / "adapter") == LoRA(4, 8, 0.0, tuple(sorted(TARGETS)))
        assert relative_error(here.eval()(input_ids=ids).logits, expected) < 1e-6
        assert not any(p.requires_grad for n, p in here.named_parameters() if ".lora_" not in n)
        # Merged: weight = base + B A alpha / rank, the adapters gone, the same function.
        q = here.model.layers[0].self_attn.q_proj
        folded = q.weight.double() + q.lora_B.weight.double() @ q.lora_A.weight.double() * 2.0
        assert len(merge_lora(here)) == 2 * len(TARGETS)
        assert relative_error(q.weight, folded) < 1e-7 and not hasattr(q, "lora_A")
        assert set(here.state_dict()) == set(llama().state_dict())
        assert relative_error(here(input_ids=ids).logits, expected) < 1e-5
        assert all(p.requires_grad for p in here.parameters())


def test_an_adapter_peft_trained_loads_here(tmp_path):
    reference = peft_model(llama()).eval()
    reference.save_pretrained(tmp_path / "peft")
    here = llama()
    load_peft_adapter(here, tmp_path / "peft")
    ids = examples()[1]["input_ids"][None]
    with torch.no_grad():
        assert relative_error(here.eval()(input_ids=ids).logits, reference(input_ids=ids).logits) < 1e-6


def test_bad_adapters_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"LoRA.targets \['qkv'\] match no module of LlamaForCausalLM"):
        Trainer(llama(), config(tmp_path, adapter=LoRA(targets=("qkv",))))
    with pytest.raises(ValueError, match=r"LoRA.rank=40 is larger than min\(in, out\) of \['model.layers.0.self_attn.q_proj"):
        Trainer(llama(), config(tmp_path, adapter=LoRA(rank=40, targets=("q_proj",))))
    with pytest.raises(ValueError, match=r"selects modules that are not nn.Linear: \['model.norm \(LlamaRMSNorm\)'\]"):
        Trainer(llama(), config(tmp_path, adapter=LoRA(targets=r"model\.norm")))
    with pytest.raises(ValueError, match="LoRA.rank must be an int >= 1; got 0"):
        LoRA(rank=0)
    with pytest.raises(TypeError, match="TrainConfig.adapter must be a zoo.adapters.LoRA or None"):
        config(tmp_path, adapter={"rank": 4})
    with torch.device("meta"):
        on_meta = llama()
    with pytest.raises(ValueError, match="LlamaForCausalLM is on the meta device"):
        Trainer(on_meta, config(tmp_path, adapter=LoRA()))
    with pytest.raises(ValueError, match="Trainer.save_adapter needs TrainConfig.adapter"):
        Trainer(llama(), config(tmp_path, max_steps=1)).save_adapter(tmp_path / "none")
    # An adapter trained on another base (wider): refused before the model is changed.
    wide = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=48, hidden_size=64, intermediate_size=64,
                                                                  num_hidden_layers=2, num_attention_heads=4))
    peft.get_peft_model(wide, peft.LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "wide")
    narrow = llama()
    with pytest.raises(ValueError, match=r"trained on another base: its 'model.layers.0.self_attn.q_proj.lora_A.weight' "
                                         r"is \(4, 64\), LlamaForCausalLM's 'model.layers.0.self_attn.q_proj' takes \(4, 32\)"):
        load_peft_adapter(narrow, tmp_path / "wide")
    assert all(p.requires_grad for p in narrow.parameters())


def test_an_adapter_on_a_linear_the_model_never_calls_is_refused_at_the_first_step(tmp_path):
    """zoo's GPT reads its feed-forward's weights in one fused function, never calling fc1 or fc2."""
    from helpers import lm_examples
    from nlp.gpt import GPT, GPTConfig

    gpt = GPT(GPTConfig(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=16))
    trainer = Trainer(gpt, config(tmp_path, adapter=LoRA(rank=2, targets="all-linear")))
    with pytest.raises(ValueError, match=r"LoRA adapters on \['blocks.0.mlp.fc1', 'blocks.0.mlp.fc2', 'blocks.1.mlp.fc1', "
                                         r"'blocks.1.mlp.fc2'\] were never called"):
        trainer.fit(lm_examples(4))
    attention_only = Trainer(GPT(GPTConfig(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=16)),
                             config(tmp_path, max_steps=3, adapter=LoRA(rank=2, targets=("q", "v"))))
    losses = [record["loss"] for record in attention_only.fit(lm_examples(4))]
    assert losses[-1] < losses[0]


def test_the_estimator_counts_the_adapters_as_the_measured_step(tmp_path):
    """Frozen parameters with no gradient or optimizer state, the adapters' own, and their
    activations: the estimate of a recomputed step is the measured peak (within 1%)."""
    cfg = config(tmp_path, max_steps=2, measure_memory=True, adapter=LoRA(rank=4))
    batch = {key: torch.stack([e[key] for e in examples()]) for key in ("input_ids", "labels")}
    strategy = Strategy(recompute="blocks")
    estimate = estimate_memory(llama(), batch, strategy, config=cfg)
    trainer = Trainer(llama(), cfg, strategy)
    trainer.fit(examples())
    measured = trainer.memory_report()[0]
    assert measured["gradients"] == 4 * trainer.num_parameters()  # the adapters' alone
    assert abs(estimate.peak - measured["peak"]) <= 0.01 * measured["peak"], (estimate.peak, measured["peak"])


def test_zoo_load_attaches_an_adapter_the_trainer_saved_on_a_zoo_model(tmp_path):
    """The zoo's own GPT (adapters on its attention's q and v, which it calls) trained 3 steps, its
    base saved as a model folder: `zoo.load(folder, adapter=...)` is the trained model."""
    from helpers import lm_examples
    from nlp.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=48, block_size=16, n_layer=2, n_head=2, n_embd=16))
    zoo.save(gpt, tmp_path / "base", card="# base\n")
    trainer = Trainer(gpt, config(tmp_path, max_steps=3, adapter=LoRA(rank=2, targets=("q", "v"))))
    trainer.fit(lm_examples(4))
    trainer.save_adapter(tmp_path / "adapter")
    loaded = zoo.load(tmp_path / "base", adapter=tmp_path / "adapter")
    ids = lm_examples(1)[0]["input_ids"][None]
    trainer.model.eval()
    with torch.no_grad():
        assert relative_error(loaded(ids)["logits"], trainer.model(ids)["logits"]) < 1e-6
        assert relative_error(loaded(ids)["logits"], zoo.load(tmp_path / "base")(ids)["logits"]) > 1e-4
