"""GPT decoder: `GPT`, `GPTConfig`."""

from nlp.gpt.config import GPTConfig
from nlp.gpt.model import GPT

__all__ = ["GPT", "GPTConfig"]
