"""The trainer's side of `TrainConfig.adapter`: attach the adapters before the model is parallelised,
refuse the strategies they do not run under yet, check the first step reaches every one, and write
them in PEFT's format."""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.strategy import Strategy
from zoo.adapters import attach_lora, reached, save_peft_adapter

log = logging.getLogger("trainers")


def prepare_adapter(model: nn.Module, config: TrainConfig, strategy: Strategy, announce: bool) -> list[str]:
    """Attach `config.adapter` to `model` in place (freezing the rest) and return the adapted modules'
    names (empty without an adapter). ValueError naming the setting for a strategy adapters do not
    run under yet: tensor parallelism (the adapters' A and B would have to split with their base's
    plan)."""
    if config.adapter is None:
        return []
    if strategy.tp > 1:
        raise ValueError(f"TrainConfig.adapter={config.adapter} with Strategy.tp={strategy.tp}: adapters under tensor "
                         f"parallelism are not built yet (their A and B would split with the base's plan); use tp=1")
    adapted = attach_lora(model, config.adapter)
    if announce:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        log.info("LoRA rank %d on %d linears of %s (%s, ...): %s of %s parameters train, the rest are frozen",
                 config.adapter.rank, len(adapted), type(model).__name__, adapted[0], f"{trainable:,}", f"{total:,}")
    return adapted


def first_step_check(model: nn.Module, adapted: list[str], steps_run: int) -> AbstractContextManager:
    """Around the first step a trainer runs: the check that its forwards call every adapted module
    (`zoo.adapters.reached`); nothing around the others or without adapters."""
    return reached(model) if adapted and steps_run == 0 else nullcontext()


def write_adapter(folder: str | os.PathLike, state: dict[str, torch.Tensor], config: TrainConfig,
                  adapted: list[str], model_class: str) -> Path:
    """Write the adapters of a consolidated model `state` to `folder` in PEFT's format
    (`zoo.adapters.save_peft_adapter`); ValueError when the run trains no adapter."""
    if config.adapter is None:
        raise ValueError("Trainer.save_adapter needs TrainConfig.adapter; this run trains the whole model "
                         "(save a checkpoint, or zoo.save the full_state_dict)")
    task = "CAUSAL_LM" if model_class.endswith("ForCausalLM") else None
    return save_peft_adapter(folder, state, config.adapter, adapted, task_type=task)
