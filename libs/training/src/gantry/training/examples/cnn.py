"""Example job: a small CNN on synthetic 28x28 images of ten classes, with augmentation.

No data to upload: the images are generated from the job's seed. Each class is a glyph -- three
random strokes in a 14x14 box, mirrored left-right -- placed up to three pixels off the
centre, scaled by 0.6-1.4 and buried in Gaussian pixel noise (standard deviation 0.4 against
strokes of about 1). The same seed gives the same images on every worker and in every run.

The task declares augmentation in its options -- a random 28x28 crop after 2 pixels of
padding, and a horizontal flip half of the time (the glyphs are symmetric, so a flip keeps the
class) -- and the runtime applies it per sample; the dataset stays as written. ``evaluate``
reports the accuracy on 2,000 held-out images drawn from their own stream.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

from gantry.training import DataContext, Task
from gantry.training.seeding import derive_seed

CLASSES = 10
SIZE = 28
GLYPH = 14
"""Side of a glyph's box in pixels."""
MAX_SHIFT = 6
"""A glyph is placed up to this many pixels right and down of the top-left corner of a
centred box, so anywhere within 3 pixels of the centre either way."""
TRAIN_IMAGES = 8_000
EVAL_IMAGES = 2_000
NOISE = 0.4
"""Standard deviation of the pixel noise; a stroke pixel is 0.6-1.4 before it."""


def glyphs(seed: int) -> torch.Tensor:
    """The ten class glyphs, (10, 14, 14) of 0 and 1: three strokes each, mirrored."""
    g = torch.Generator().manual_seed(derive_seed(seed, "cnn-glyphs"))
    out = torch.zeros(CLASSES, GLYPH, GLYPH)
    along = torch.linspace(0.0, 1.0, 3 * GLYPH)[:, None]
    for k in range(CLASSES):
        for _ in range(3):
            start, end = torch.randint(0, GLYPH, (2, 2), generator=g).float()
            points = (start + along * (end - start)).round().long()
            out[k, points[:, 0], points[:, 1]] = 1.0
    return torch.maximum(out, out.flip(-1))


def images(seed: int, count: int, stream: str) -> TensorDataset:
    """``count`` labelled images of ``stream`` ("train" or "eval"): (1, 28, 28) float32, label."""
    g = torch.Generator().manual_seed(derive_seed(seed, "cnn-images", stream))
    shapes = glyphs(seed)
    labels = torch.randint(CLASSES, (count,), generator=g)
    corners = (SIZE - GLYPH - MAX_SHIFT) // 2 + torch.randint(
        0, MAX_SHIFT + 1, (count, 2), generator=g
    )
    pixels = torch.zeros(count, 1, SIZE, SIZE)
    for i, (top, left) in enumerate(corners.tolist()):
        pixels[i, 0, top : top + GLYPH, left : left + GLYPH] = shapes[labels[i]]
    pixels *= 0.6 + 0.8 * torch.rand(count, 1, 1, 1, generator=g)
    pixels += NOISE * torch.randn(pixels.shape, generator=g)
    return TensorDataset(pixels, labels)


def model() -> nn.Module:
    """Two 3x3 convolution blocks with max pooling, then a small classifier head."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, 64),
        nn.ReLU(),
        nn.Linear(64, CLASSES),
    )


def dataset(ctx: DataContext) -> TensorDataset:
    """The training images (the runtime augments them as the options say)."""
    return images(ctx.seed, TRAIN_IMAGES, "train")


def evaluate(model: nn.Module, ctx: DataContext) -> Mapping[str, float]:
    """Accuracy and loss on the held-out images (never augmented, never trained on)."""
    features, labels = images(ctx.seed, EVAL_IMAGES, "eval").tensors
    device = next(model.parameters()).device
    with torch.no_grad():
        chunks = [features[i : i + 500] for i in range(0, len(features), 500)]
        logits = torch.cat([model(chunk.to(device)).float().cpu() for chunk in chunks])
    return {
        "accuracy": float((logits.argmax(dim=1) == labels).float().mean()),
        "eval_loss": float(functional.cross_entropy(logits, labels)),
    }


task = Task(
    model=model,
    loss=functional.cross_entropy,
    dataset=dataset,
    evaluate=evaluate,
    example_input=lambda: torch.zeros(2, 1, SIZE, SIZE),
    options={
        "epochs": 8,
        "micro_batch_size": 64,
        "lr": 3e-3,
        "augment": {"image": {"crop": SIZE, "padding": 2, "flip": 0.5}},
    },
    model_name="synthetic-cnn",
    description="A small CNN on ten synthetic glyph classes (28x28, augmented).",
)
"""The job's task: ``entrypoint: {task: gantry.training.examples.cnn:task}``."""
