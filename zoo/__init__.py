"""memzoo's floor: the model registry, model folders on disk, and the fused layers and kernels (`zoo.nn`).

    zoo.create("gpt", n_layer=4)        a fresh model of a registered architecture
    zoo.load("gpt-shakespeare-char")    a trained model by zoo name or folder path
    zoo.save(model, "dir", card=...)    safetensors + config.json + model card
    zoo.list_models()                   every model loadable by name
"""

from zoo.registry import create, register
from zoo.store import list_models, load, save

__all__ = ["create", "list_models", "load", "register", "save"]
