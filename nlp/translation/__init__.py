"""Encoder-decoder translation: the `Translator` model on `zoo.nn` and its imports."""

from nlp.translation.config import TranslatorConfig
from nlp.translation.model import Translator

__all__ = ["Translator", "TranslatorConfig"]
