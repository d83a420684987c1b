"""How images become a classifier's `pixel_values`: the `ImageProcessor` spec saved beside a model
(config.json "image_processor"), applied to uint8 tensors in training and to image files by
`zoo classify`; and the collate function of labelled examples, with optional augmentation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vision.augment import Augmentation, augment
from vision.digits import MNIST_SIZE, frame_like_mnist


@dataclass(frozen=True)
class ImageProcessor:
    """Grey-scale or colour images -> normalised (B, C, image_size, image_size) float32."""

    image_size: int = MNIST_SIZE
    """Side of the square images the model reads; others are resized (bilinear) to it."""
    num_channels: int = 1
    """1 (grey) or 3 (RGB)."""
    mean: float = 0.1307
    """Subtracted from pixel values scaled to [0, 1] (MNIST's mean by default)."""
    std: float = 0.3081
    """Then divided by this."""
    digit_frame: bool = True
    """Image files are framed like MNIST (grey only): made ink-bright on black (inverted when the
    border is brighter than the whole), cropped to the ink, scaled into a 20x20 box and centred
    by mass on a 28x28 canvas, which is then resized to image_size."""

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f"ImageProcessor.image_size must be >= 1; got {self.image_size}")
        if self.num_channels not in (1, 3):
            raise ValueError(f"ImageProcessor.num_channels must be 1 or 3; got {self.num_channels}")
        if self.std <= 0:
            raise ValueError(f"ImageProcessor.std must be > 0; got {self.std}")
        if self.digit_frame and self.num_channels != 1:
            raise ValueError(f"ImageProcessor.digit_frame needs num_channels=1; got {self.num_channels}")

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """(N, H, W) or (N, C, H, W) uint8 -> (N, C, image_size, image_size) float32."""
        x = images.unsqueeze(1) if images.ndim == 3 else images
        if x.ndim != 4 or x.shape[1] != self.num_channels or x.dtype != torch.uint8:
            raise ValueError(f"images must be uint8 (N, H, W) or (N, {self.num_channels}, H, W); "
                             f"got {tuple(images.shape)} {images.dtype}")
        x = x.float() / 255
        if x.shape[2:] != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False,
                              antialias=max(x.shape[2:]) > self.image_size).clamp(0, 1)
        return (x - self.mean) / self.std

    def load(self, path: str | Path) -> torch.Tensor:
        """An image file -> (1, C, image_size, image_size) pixel_values; ValueError naming the file
        when it is missing or not a readable image."""
        from PIL import Image, UnidentifiedImageError

        if not Path(path).is_file():
            raise ValueError(f"image {str(path)!r} does not exist (or is not a file)")
        try:
            with Image.open(path) as opened:
                image = opened.convert("L" if self.num_channels == 1 else "RGB")
        except (UnidentifiedImageError, OSError) as error:
            raise ValueError(f"{str(path)!r} is not a readable image: {error}") from error
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        pixels = pixels.reshape(image.height, image.width, self.num_channels).permute(2, 0, 1)
        if not self.digit_frame:
            return self.prepare(pixels.unsqueeze(0))
        grey = pixels[0]
        border = torch.cat([grey[0], grey[-1], grey[:, 0], grey[:, -1]]).float().mean()
        if border > grey.float().mean():
            grey = 255 - grey
        return self.prepare(frame_like_mnist(grey.unsqueeze(0)))


class LabelledImages(torch.utils.data.Dataset):
    """Images with class labels as examples {"pixel_values": (C, S, S) float32, "labels": () int64};
    the images stay uint8 and each is prepared when it is read."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, processor: ImageProcessor) -> None:
        if labels.shape != images.shape[:1]:
            raise ValueError(f"labels must have shape ({images.shape[0]},); got {tuple(labels.shape)}")
        self.images, self.labels, self.processor = images, labels.long(), processor

    def __len__(self) -> int:
        return self.labels.numel()

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.processor.prepare(self.images[index : index + 1])[0], "labels": self.labels[index]}


class ClassificationCollate:
    """Stacks examples into {"pixel_values" (B, C, H, W), "labels" (B,)}; augments the images when
    given an `Augmentation` (drawing from torch's global generator, which the trainer seeds per
    step). The background of normalised images is -mean/std, so images are augmented with the
    background moved to 0 and back."""

    def __init__(self, processor: ImageProcessor, augmentation: Augmentation | None = None) -> None:
        self.augmentation, self.background = augmentation, -processor.mean / processor.std

    def __call__(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        pixel_values = torch.stack([e["pixel_values"] for e in examples])
        if self.augmentation is not None:
            pixel_values = augment(pixel_values - self.background, self.augmentation) + self.background
        return {"pixel_values": pixel_values, "labels": torch.stack([e["labels"] for e in examples])}
