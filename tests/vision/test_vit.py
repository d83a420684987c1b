"""ViT on zoo.nn against transformers: tiny random ViTModel / ViTForImageClassification folders load
into ours with equal outputs and gradients, ours export back, and other image sizes interpolate the
positions as transformers does."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file

import zoo
from vision.hf import vit_from_hf
from vision.vit import ViT, ViTConfig
from zoo.hf import export_hf
from zoo.parity import relative_error

KINDS = {"ViTForImageClassification": "logits", "ViTModel": "pooler_output"}


def hf_vit(tmp_path, kind: str):
    torch.manual_seed(2)
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=5)
    model = getattr(transformers, kind)(config).eval()
    with torch.no_grad():  # non-trivial norms, biases, class token and positions
        for name, param in model.named_parameters():
            param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(tmp_path / kind)
    return model, tmp_path / kind


def stored_gradients(save, tmp_path, name) -> dict[str, torch.Tensor]:
    """Gradients under the names a folder stores, by saving a copy whose weights are the gradients."""
    save(tmp_path / name)
    return load_file(tmp_path / name / "model.safetensors")


def swap_in_gradients(model):
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.grad)


@pytest.mark.parametrize("kind", KINDS)
def test_import_matches_transformers_outputs_and_gradients(tmp_path, kind):
    theirs, folder = hf_vit(tmp_path, kind)
    ours = zoo.load(folder)
    assert isinstance(ours, ViT) and ours.config.head == ("classification" if kind != "ViTModel" else "none")
    pixels = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    key = KINDS[kind]
    mine, expected = ours(pixels)[key], getattr(theirs(pixel_values=pixels), key)
    assert relative_error(mine, expected) < 1e-5
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(4))
    (mine * weights).sum().backward()
    (expected * weights).sum().backward()
    swap_in_gradients(ours)
    swap_in_gradients(theirs)
    our_grads = stored_gradients(lambda d: export_hf(ours, d), tmp_path, "ours")
    their_grads = stored_gradients(theirs.save_pretrained, tmp_path, "theirs")
    assert our_grads.keys() == their_grads.keys()
    scale = max(grad.abs().max().item() for grad in their_grads.values())
    for name, grad in their_grads.items():
        if name.endswith("key.bias"):  # zero in exact arithmetic (softmax ignores it): both are rounding
            assert max(our_grads[name].abs().max().item(), grad.abs().max().item()) < 1e-5 * scale
        else:
            assert relative_error(our_grads[name], grad) < 1e-5, name


@pytest.mark.parametrize("head", ["classification", "none"])
def test_export_loads_in_transformers(tmp_path, head):
    torch.manual_seed(5)
    ours = ViT(ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, num_labels=7, head=head)).eval()
    export_hf(ours, tmp_path / "export")
    theirs = getattr(transformers, "ViTForImageClassification" if head == "classification" else "ViTModel") \
        .from_pretrained(tmp_path / "export").eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(6))
    key = "logits" if head == "classification" else "pooler_output"
    assert relative_error(ours(pixels)[key], getattr(theirs(pixel_values=pixels), key)) < 1e-6
    back = vit_from_hf(tmp_path / "export")
    assert torch.equal(back(pixels)[key], ours(pixels)[key])


def test_other_image_sizes_interpolate_positions_like_transformers(tmp_path):
    theirs, folder = hf_vit(tmp_path, "ViTForImageClassification")
    ours = zoo.load(folder)
    pixels = torch.randn(2, 3, 24, 32, generator=torch.Generator().manual_seed(7))
    expected = theirs(pixel_values=pixels, interpolate_pos_encoding=True).logits
    assert relative_error(ours(pixels)["logits"], expected) < 1e-5


def test_fp32_matches_float64_and_bad_inputs():
    torch.manual_seed(8)
    config = ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32, num_labels=3)
    model = ViT(config).eval()
    reference = ViT(config).double().eval()
    reference.load_state_dict(model.state_dict())
    pixels = torch.randn(4, 1, 8, 8)
    assert relative_error(model(pixels)["logits"], reference(pixels.double())["logits"]) < 1e-5
    loss = model(pixels, labels=torch.tensor([0, 1, 2, 0]))["loss"]
    assert loss.shape == () and loss.item() > 0
    with pytest.raises(ValueError, match="pixel_values must have shape \\(B, 1, H, W\\)"):
        model(torch.randn(4, 3, 8, 8))
    with pytest.raises(ValueError, match="multiples of patch_size=4"):
        model(torch.randn(4, 1, 9, 8))
    with pytest.raises(ValueError, match="ViTConfig.image_size must be divisible by patch_size=4"):
        ViTConfig(image_size=10, patch_size=4)
