"""Adapters that fine-tune a frozen model: LoRA (`zoo.adapters.lora`) in PEFT's folder format
(`zoo.adapters.peft_format`)."""

from zoo.adapters.lora import LoRA, adapted_modules, attach_lora, is_adapter_parameter, merge_lora, reached, targeted
from zoo.adapters.peft_format import load_peft_adapter, read_peft_config, save_peft_adapter

__all__ = ["LoRA", "adapted_modules", "attach_lora", "is_adapter_parameter", "load_peft_adapter", "merge_lora",
           "reached", "read_peft_config", "save_peft_adapter", "targeted"]
