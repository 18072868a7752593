"""Text generation helpers: the vocabulary's encoding, the model's input window (left-aligned,
padded after the prompt, which causal attention ignores) and sampling."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from gantry.core import InvalidInput
from gantry.serving.errors import BadRequest, ModelFailed
from gantry.serving.generation import Generation
from gantry.serving.runtime import Artifact, load_model
from gantry.training.examples import transformer
from gantry.training.examples.transformer import ALPHABET, CONTEXT, CharTransformer
from gantry.training.export import export_model

EXAMPLE = Generation(vocabulary=ALPHABET, context=CONTEXT)


def test_the_signature_entry_is_parsed_and_checked() -> None:
    signature = {"generation": {"vocabulary": "ab\n", "context": 4}}
    assert Generation.from_signature(signature) == Generation("ab\n", 4)
    assert Generation.from_signature({"inputs": []}) is None
    for bad, message in [
        ({"vocabulary": "", "context": 4}, "non-empty string"),
        ({"vocabulary": "abca", "context": 4}, "repeats 'a'"),
        ({"vocabulary": "ab", "context": 0}, "must be > 0"),
        ({"vocabulary": "ab", "context": 4.0}, "must be an integer"),
        ({"vocabulary": "ab", "context": True}, "must be an integer"),
        ({"vocabulary": "ab"}, "lacks context"),
        ({"vocabulary": "ab", "context": 4, "eos": 1}, "has eos"),
        ("ab", "must be an object"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            Generation.from_signature({"generation": bad})


def test_the_transformer_tasks_signature_entry_is_what_serving_reads() -> None:
    assert transformer.task.generation is not None
    assert Generation.from_signature({"generation": dict(transformer.task.generation)}) == EXAMPLE


def test_encode_and_decode_follow_the_vocabulary() -> None:
    text = "The fox sleeps.\nDo two wolves see the mill?"
    ids = EXAMPLE.encode(text)
    assert ids == transformer.encode(text).tolist()
    assert EXAMPLE.decode(ids) == text
    assert EXAMPLE.decode(np.array(ids)) == text
    assert EXAMPLE.encode("") == [] and EXAMPLE.decode([]) == ""


def test_a_character_outside_the_vocabulary_is_a_bad_request_naming_it() -> None:
    with pytest.raises(BadRequest, match=r"holds '7' \(at position 4\)") as raised:
        EXAMPLE.encode("the 7 foxes")
    assert f"it knows only {ALPHABET!r}" in str(raised.value)
    with pytest.raises(BadRequest, match="outside the vocabulary"):
        EXAMPLE.decode([len(ALPHABET)])


def test_the_window_holds_the_last_ids_left_aligned_then_padding() -> None:
    small = Generation("\nabc", 4)
    window, position = small.window([1, 2])
    assert window.dtype == np.int64 and window.shape == (1, 4)
    assert window.tolist() == [[1, 2, 0, 0]] and position == 1
    window, position = small.window([1, 2, 3, 1, 2, 3])
    assert window.tolist() == [[3, 1, 2, 3]] and position == 3
    window, position = small.window([3, 2, 1, 3])
    assert window.tolist() == [[3, 2, 1, 3]] and position == 3


def test_an_empty_prompt_starts_from_the_first_character() -> None:
    window, position = EXAMPLE.window([])
    assert window.tolist() == [[0] * CONTEXT] and position == 0
    assert ALPHABET[0] == "\n"


def test_padding_after_the_prompt_does_not_change_its_logits(tmp_path: Path) -> None:
    torch.manual_seed(0)
    name, fmt, signature = export_model(
        CharTransformer().eval(), torch.zeros(2, CONTEXT, dtype=torch.long), tmp_path
    )
    signature["generation"] = {"vocabulary": ALPHABET, "context": CONTEXT}
    model = load_model(Artifact("lm", 1, (tmp_path / name).read_bytes(), fmt, signature))
    assert model.generation == EXAMPLE
    ids = EXAMPLE.encode("A tired fox")
    window, position = EXAMPLE.window(ids)
    noisy = window.copy()
    noisy[0, position + 1 :] = np.random.default_rng(0).integers(
        1, len(ALPHABET), CONTEXT - position - 1
    )
    padded, other = model.run([np.concatenate([window, noisy])])[0]
    np.testing.assert_array_equal(padded[: position + 1], other[: position + 1])
    assert not np.array_equal(padded[position + 1 :], other[position + 1 :])


def test_temperature_zero_is_greedy() -> None:
    rng = np.random.default_rng(0)
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert all(EXAMPLE.sample(logits, 0.0, rng) == 1 for _ in range(10))


def test_sampling_follows_the_softmax_of_logits_over_temperature() -> None:
    rng = np.random.default_rng(0)
    logits = np.log(np.array([0.1, 0.2, 0.7]))
    draws = Counter(EXAMPLE.sample(logits, 1.0, rng) for _ in range(4000))
    assert [round(draws[i] / 4000, 1) for i in range(3)] == [0.1, 0.2, 0.7]
    hot = Counter(EXAMPLE.sample(logits, 100.0, rng) for _ in range(3000))
    assert all(0.25 < hot[i] / 3000 < 0.42 for i in range(3))  # nearly uniform
    cold = {EXAMPLE.sample(logits, 0.01, rng) for _ in range(100)}
    assert cold == {2}


def test_sampling_is_numerically_stable_and_reproducible() -> None:
    huge = np.array([1e30, 1e30 - 1e24, -1e30, -np.inf])
    assert EXAMPLE.sample(huge, 1e-6, np.random.default_rng(0)) == 0
    assert EXAMPLE.sample(huge, 1e12, np.random.default_rng(0)) in {0, 1}
    logits = np.random.default_rng(1).standard_normal(59)
    first = [EXAMPLE.sample(logits, 0.8, np.random.default_rng(7)) for _ in range(5)]
    assert len(set(first)) == 1


def test_bad_temperatures_and_logits_are_refused() -> None:
    rng = np.random.default_rng(0)
    for temperature in (-0.1, float("nan"), float("inf")):
        with pytest.raises(BadRequest, match="temperature"):
            EXAMPLE.sample(np.zeros(3), temperature, rng)
    with pytest.raises(ModelFailed, match="NaN"):
        EXAMPLE.sample(np.array([0.0, np.nan]), 1.0, rng)
    with pytest.raises(ModelFailed, match="all infinite"):
        EXAMPLE.sample(np.array([-np.inf, -np.inf]), 0.0, rng)
