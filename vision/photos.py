"""Real photographs: those of OpenCV's examples (Debian `opencv-doc`, `examples/data`), people
(a footballer, basketball players), animals, fruit, buildings, aerial views and paintings among
them, read once and cached as one tensor per size.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from zoo.downloads import data_dir, debian_package, write_atomically

OPENCV_PACKAGE = "opencv-doc"
PHOTO_FOLDER = "./usr/share/doc/opencv-doc/examples/data/"
PHOTOS = ("messi5.jpg", "basketball1.png", "basketball2.png", "baboon.jpg", "fruits.jpg", "home.jpg", "building.jpg",
          "squirrel_cls.jpg", "butterfly.jpg", "apple.jpg", "orange.jpg", "starry_night.jpg", "aero1.jpg",
          "leuvenA.jpg", "board.jpg", "HappyFish.jpg")
"""The photographs read, in this order."""


def _read(size: int, root: Path) -> torch.Tensor:
    from PIL import Image

    deb = debian_package(OPENCV_PACKAGE, root)
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    images = []
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for name in PHOTOS:
            image = Image.open(io.BytesIO(archive.extractfile(PHOTO_FOLDER + name).read())).convert("RGB")
            side = min(image.size)  # the central square, then resized
            left, top = (image.width - side) // 2, (image.height - side) // 2
            image = image.crop((left, top, left + side, top + side)).resize((size, size), Image.BILINEAR)
            pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).reshape(size, size, 3)
            images.append(pixels.permute(2, 0, 1))
    return torch.stack(images).contiguous()


def opencv_photos(size: int = 96, root: Path | None = None) -> torch.Tensor:
    """The `PHOTOS` as (16, 3, size, size) uint8 RGB: each one's central square resized (bilinear)."""
    if size < 1:
        raise ValueError(f"size must be >= 1 pixel; got {size}")
    root = data_dir() if root is None else root
    path = root / f"opencv_photos_{size}.safetensors"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        write_atomically(path, save({"images": _read(size, root)}))
    return load_file(path)["images"]
