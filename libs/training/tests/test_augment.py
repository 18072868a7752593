"""Augmentation: what each transform does to a sample, its seeding, its configuration, and that
the trainer applies it to a user's dataset without any change to the user's code."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from gantry.core import ConfigError, InvalidInput
from gantry.training.augment import (
    Augmentation,
    AugmentedDataset,
    ImageAugment,
    TabularAugment,
    parse_augmentation,
)
from gantry.training.trainer import Trainer, TrainingOptions, WorkerEnv


def images(n: int = 16) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.rand(n, 3, 28, 28, generator=g), torch.arange(n))


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_crop_with_padding_keeps_the_shape_and_moves_the_content() -> None:
    image = torch.rand(3, 28, 28)
    crop = ImageAugment(crop=28, padding=2)
    outputs = [crop.apply(image, generator(seed)) for seed in range(20)]
    assert all(out.shape == (3, 28, 28) for out in outputs)
    assert any(not torch.equal(out, image) for out in outputs)  # shifted by up to 2 px
    for out in outputs:  # every output is a window of the zero-padded image
        padded = nn.functional.pad(image, (2, 2, 2, 2))
        windows = [padded[:, t : t + 28, s : s + 28] for t in range(5) for s in range(5)]
        assert any(torch.equal(out, w) for w in windows)


def test_crop_to_a_smaller_rectangle() -> None:
    out = ImageAugment(crop=(20, 24)).apply(torch.rand(1, 28, 28), generator())
    assert out.shape == (1, 20, 24)


def test_flip_reverses_the_width_axis_only() -> None:
    image = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    assert torch.equal(ImageAugment(flip=1.0).apply(image, generator()), image.flip(-1))
    assert torch.equal(ImageAugment(flip=1.0).apply(image, generator())[:, :, 0], image[:, :, 3])
    assert torch.equal(ImageAugment(flip=0.0).apply(image, generator()), image)
    flips = sum(
        torch.equal(ImageAugment(flip=0.5).apply(image, generator(s)), image.flip(-1))
        for s in range(400)
    )
    assert 160 < flips < 240  # binomial(400, 0.5): mean 200, sd 10


def test_the_same_seed_epoch_and_index_give_the_same_augmentation() -> None:
    aug = Augmentation.from_mapping({"image": {"crop": 28, "padding": 4, "flip": 0.5}})
    first = AugmentedDataset(images(), aug, seed=7)
    again = AugmentedDataset(images(), aug, seed=7)
    reads = [first[i][0] for i in range(16)]
    assert all(torch.equal(again[i][0], reads[i]) for i in reversed(range(16)))  # any order
    assert torch.equal(first[3][0], reads[3])  # rereading does not move a shared generator
    first.set_epoch(1)
    assert sum(torch.equal(first[i][0], reads[i]) for i in range(16)) < 4
    other_seed = AugmentedDataset(images(), aug, seed=8)
    assert sum(torch.equal(other_seed[i][0], reads[i]) for i in range(16)) < 4
    assert [first[i][1] for i in range(16)] == list(range(16))  # targets untouched


def test_tabular_noise_has_the_requested_std() -> None:
    features = torch.full((200_000,), 3.0)
    noisy = TabularAugment(noise_std=0.05).apply(features, generator())
    noise = noisy - features
    # the sample std of 200k normal draws is within 0.5% of the true one (about 3 sd)
    assert abs(float(noise.std()) - 0.05) < 0.05 * 0.005
    assert abs(float(noise.mean())) < 0.05 * 0.01
    assert noisy.dtype == features.dtype


def test_tabular_noise_refuses_integer_features() -> None:
    with pytest.raises(InvalidInput, match="floating-point features"):
        TabularAugment(noise_std=0.1).apply(torch.arange(4), generator())


def test_image_augmentation_refuses_a_flat_tensor() -> None:
    with pytest.raises(InvalidInput, match=r"\(C, H, W\) tensor, got shape \(8,\)"):
        ImageAugment(flip=0.5).apply(torch.rand(8), generator())


def test_a_crop_larger_than_the_padded_image_is_refused() -> None:
    with pytest.raises(InvalidInput, match="a 40x40 crop does not fit a 32x32 image"):
        ImageAugment(crop=40, padding=2).apply(torch.rand(3, 28, 28), generator())


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"audio": {}}, "unknown augmentation 'audio'"),
        ({"image": {"rotate": 10}}, "unknown image augmentation field 'rotate'"),
        ({"image": {"flip": 2}}, "flip is a probability"),
        ({"image": {"crop": 0}}, "crop must be a positive size"),
        ({"image": {"padding": -1}}, "padding must be 0 or more"),
        ({"tabular": {}}, "tabular augmentation: .*noise_std"),
        ({"tabular": {"noise_std": 0}}, "noise_std must be positive"),
        ({"image": {"flip": 0.5}, "tabular": {"noise_std": 0.1}}, "exactly one of"),
        ({"image": 0.5}, "must be a mapping"),
    ],
)
def test_configuration_errors_say_what_to_write(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Augmentation.from_mapping(config)


def test_parsing_a_configuration() -> None:
    parsed = parse_augmentation({"image": {"crop": [24, 20], "flip": 0.5}})
    assert parsed == Augmentation(image=ImageAugment(crop=(24, 20), flip=0.5))
    assert parse_augmentation(parsed) is parsed
    assert parse_augmentation(None) is None and parse_augmentation({}) is None


def test_samples_the_wrapper_cannot_augment_are_refused() -> None:
    class Strings(Dataset[str]):
        def __len__(self) -> int:
            return 1

        def __getitem__(self, index: int) -> str:
            return "x"

    wrapped = AugmentedDataset(Strings(), Augmentation(tabular=TabularAugment(0.1)), seed=0)
    with pytest.raises(InvalidInput, match="cannot augment a sample of type str"):
        wrapped[0]


# -- applied by the runtime's loader ------------------------------------------------------------


class Recorder(nn.Module):
    """A model that keeps every batch of inputs it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.detach().clone())
        return self.linear(x)


def zeros() -> TensorDataset:
    """The user's dataset, written with no augmentation in mind: all features are zero."""
    return TensorDataset(torch.zeros(512, 4), torch.zeros(512, 1))


def run(augment: Any, seed: int = 0) -> torch.Tensor:
    model = Recorder()
    trainer = Trainer(
        lambda: model,
        nn.functional.mse_loss,
        zeros,
        options=TrainingOptions(
            micro_batch_size=64, epochs=2, augment=augment, seed=seed, device="cpu"
        ),
        env=WorkerEnv(),
    )
    trainer.fit()
    assert isinstance(trainer.dataset, AugmentedDataset) == (augment is not None)
    return torch.cat(model.seen)


def test_the_trainer_augments_a_users_dataset_with_no_change_to_it() -> None:
    assert torch.count_nonzero(run(None)) == 0
    seen = run({"tabular": {"noise_std": 0.05}})
    assert seen.shape == (2 * 512, 4)
    assert abs(float(seen.std()) - 0.05) < 0.003
    assert torch.equal(run({"tabular": {"noise_std": 0.05}}), seen)  # reproducible
    assert not torch.equal(run({"tabular": {"noise_std": 0.05}}, seed=1), seen)
    # each epoch draws new noise for the same samples
    first_epoch, second_epoch = seen[:512], seen[512:]
    assert not torch.equal(first_epoch.sort(0).values, second_epoch.sort(0).values)
