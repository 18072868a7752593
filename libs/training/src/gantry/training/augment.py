"""Data augmentation declared in configuration and applied per sample by the runtime's loader.

The user's dataset stays as written: the trainer wraps it in :class:`AugmentedDataset` when the
options name an augmentation, e.g.::

    {"image": {"crop": 28, "padding": 2, "flip": 0.5}}   # random crop after zero padding,
                                                         # horizontal flip half of the time
    {"tabular": {"noise_std": 0.05}}                     # x + N(0, 0.05^2), element-wise

A sample is either a tensor or a tuple/list whose first item is the features tensor (the usual
``(features, target)`` pair); only the features are augmented, the rest passes through.

Every sample's draws come from its own generator, seeded from ``(seed, epoch, index)``: the
same sample gets the same augmentation in a rerun whatever the number of ranks, DataLoader
workers or the order they fetch in, and a different one in the next epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional
from torch.utils.data import Dataset

from gantry.core import ConfigError, InvalidInput
from gantry.training.seeding import derive_seed

_EXAMPLE = '{"image": {"crop": 28, "padding": 2, "flip": 0.5}} or {"tabular": {"noise_std": 0.05}}'


@dataclass(frozen=True)
class ImageAugment:
    """Augmentation of image tensors shaped (C, H, W).

    ``crop``: the (height, width) of a random crop taken after padding, in pixels; an int
    means a square; None keeps the padded size (so padding without crop grows the image).
    ``padding``: zeros added on every side before cropping, in pixels; 0 by default, so a crop
    is taken from inside the image. ``flip``: the probability of reversing the width axis
    (0 by default: no flipping).
    """

    crop: int | tuple[int, int] | None = None
    padding: int = 0
    flip: float = 0.0

    def __post_init__(self) -> None:
        sizes = (self.crop,) * 2 if isinstance(self.crop, int) else self.crop
        if sizes is not None and (len(sizes) != 2 or min(sizes) < 1):
            raise ConfigError(
                f"image crop must be a positive size, got {self.crop!r}",
                hint="write a side in pixels (28) or [height, width]",
            )
        if self.padding < 0:
            raise ConfigError(f"image padding must be 0 or more pixels, got {self.padding}")
        if not 0.0 <= self.flip <= 1.0:
            raise ConfigError(
                f"image flip is a probability between 0 and 1, got {self.flip}",
                hint="0.5 flips half of the samples",
            )

    def apply(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``image`` padded, cropped and flipped with draws from ``generator``."""
        if image.dim() != 3:
            raise InvalidInput(
                f"image augmentation expects a (C, H, W) tensor, got shape {tuple(image.shape)}",
                hint="use tabular augmentation for feature vectors",
            )
        if self.padding:
            image = functional.pad(image, (self.padding,) * 4)
        if self.crop is not None:
            height, width = (self.crop,) * 2 if isinstance(self.crop, int) else self.crop
            full_h, full_w = image.shape[-2:]
            if height > full_h or width > full_w:
                raise InvalidInput(
                    f"a {height}x{width} crop does not fit a {full_h}x{full_w} image "
                    f"(after {self.padding} px of padding)",
                    hint="lower crop or raise padding",
                )
            top = int(torch.randint(full_h - height + 1, (1,), generator=generator))
            left = int(torch.randint(full_w - width + 1, (1,), generator=generator))
            image = image[:, top : top + height, left : left + width]
        if self.flip and float(torch.rand((), generator=generator)) < self.flip:
            image = image.flip(-1)
        return image.contiguous()


@dataclass(frozen=True)
class TabularAugment:
    """Gaussian noise added to every feature: ``x + N(0, noise_std^2)``.

    ``noise_std`` is in the features' own units (standardise features first if they differ in
    scale); it must be positive -- leave ``tabular`` out to add no noise.
    """

    noise_std: float

    def __post_init__(self) -> None:
        if not self.noise_std > 0:
            raise ConfigError(
                f"tabular noise_std must be positive, got {self.noise_std}",
                hint="leave out 'tabular' for no noise",
            )

    def apply(self, features: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``features`` plus noise drawn from ``generator``."""
        if not features.is_floating_point():
            raise InvalidInput(
                f"tabular noise needs floating-point features, got {features.dtype}",
                hint="convert the features to float32 in the dataset",
            )
        # drawn on the CPU, where the generator lives, whatever device the features are on
        noise = torch.randn(features.shape, generator=generator, dtype=features.dtype)
        return features + noise.to(features.device) * self.noise_std


@dataclass(frozen=True)
class Augmentation:
    """One augmentation: for images or for tabular features (not both: a sample is one kind)."""

    image: ImageAugment | None = None
    tabular: TabularAugment | None = None

    def __post_init__(self) -> None:
        if (self.image is None) == (self.tabular is None):
            raise ConfigError(
                "an augmentation names exactly one of 'image' or 'tabular'",
                hint=f"write e.g. {_EXAMPLE}",
            )

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> Augmentation:
        """The augmentation a configuration mapping declares (see the module docstring).

        Raises :class:`ConfigError` naming an unknown section or field and what is allowed.
        """
        kinds: dict[str, Any] = {"image": ImageAugment, "tabular": TabularAugment}
        unknown = sorted(set(config) - set(kinds))
        if unknown:
            raise ConfigError(
                f"unknown augmentation {', '.join(map(repr, unknown))}",
                hint=f"use 'image' or 'tabular', e.g. {_EXAMPLE}",
            )
        built: dict[str, Any] = {}
        for kind, fields in config.items():
            if not isinstance(fields, Mapping):
                raise ConfigError(f"augmentation {kind!r} must be a mapping of its fields")
            allowed = kinds[kind].__dataclass_fields__
            extra = sorted(set(fields) - set(allowed))
            if extra:
                raise ConfigError(
                    f"unknown {kind} augmentation field {', '.join(map(repr, extra))}",
                    hint=f"{kind} takes {', '.join(allowed)}",
                )
            crop = fields.get("crop")
            if isinstance(crop, list):  # YAML and JSON give [h, w] as a list
                fields = {**fields, "crop": tuple(crop)}
            try:
                built[kind] = kinds[kind](**fields)
            except TypeError as exc:  # a required field is missing
                raise ConfigError(f"{kind} augmentation: {exc}") from None
        return cls(**built)

    def apply(self, features: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """``features`` augmented with draws from ``generator``."""
        if self.image is not None:
            return self.image.apply(features, generator)
        assert self.tabular is not None  # __post_init__ guarantees one of the two
        return self.tabular.apply(features, generator)


def parse_augmentation(config: Augmentation | Mapping[str, Any] | None) -> Augmentation | None:
    """An :class:`Augmentation` from a mapping (or itself); None or an empty mapping is none."""
    if config is None or isinstance(config, Augmentation):
        return config
    return Augmentation.from_mapping(config) if config else None


class AugmentedDataset(Dataset[Any]):
    """``dataset`` with ``augmentation`` applied to each sample's features as it is read.

    Sample ``index`` in epoch ``e`` is augmented with a generator seeded from
    ``(seed, e, index)``; call :meth:`set_epoch` before each epoch (the trainer does).
    """

    def __init__(self, dataset: Dataset[Any], augmentation: Augmentation, *, seed: int) -> None:
        if not isinstance(dataset, Sized):
            raise InvalidInput(
                f"augmentation needs a map-style dataset with a length, got "
                f"{type(dataset).__name__}",
                hint="implement __len__ and __getitem__ in the dataset",
            )
        self.dataset = dataset
        self.augmentation = augmentation
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the next reads' augmentations for ``epoch``."""
        self.epoch = epoch

    def __len__(self) -> int:
        assert isinstance(self.dataset, Sized)  # checked in __init__
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        sample = self.dataset[index]
        generator = torch.Generator().manual_seed(derive_seed(self.seed, self.epoch, index))
        if isinstance(sample, torch.Tensor):
            return self.augmentation.apply(sample, generator)
        if isinstance(sample, tuple | list) and sample and isinstance(sample[0], torch.Tensor):
            features = self.augmentation.apply(sample[0], generator)
            rest = list(sample[1:])
            return (features, *rest) if isinstance(sample, tuple) else [features, *rest]
        raise InvalidInput(
            f"cannot augment a sample of type {type(sample).__name__}",
            hint="return a tensor or a (features, target) tuple from the dataset",
        )


__all__ = [
    "Augmentation",
    "AugmentedDataset",
    "ImageAugment",
    "TabularAugment",
    "parse_augmentation",
]
