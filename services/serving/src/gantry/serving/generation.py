"""Text generation with a character-level language model: prompt in, one token at a time out.

A model is generative when its registered signature carries ``"generation": {"vocabulary":
"...", "context": 64}`` (the training task's ``generation`` field writes it): character
``vocabulary[i]`` is token ``i``, and the model takes token ids ``(batch, context)`` (int64)
and returns logits ``(batch, context, len(vocabulary))``, position ``t`` predicting token
``t + 1``. :class:`Generation` turns text into ids and back, builds the model's input window
for the text so far and samples the next token from the logits; the serving loop is::

    ids = generation.encode(prompt)
    for _ in range(max_tokens):
        window, position = generation.window(ids)
        logits = model.run([window])[0]
        ids.append(generation.sample(logits[0, position], temperature, rng))

**Padding.** The window holds the last ``context`` ids left-aligned, followed by padding
(token 0) up to ``context``. The model's attention is causal, so position ``t`` sees only
positions ``0..t``: the logits at the prompt's last position are the same whatever the padding
after it holds, and the window always starts at position 0 as in training (no learned
position is wasted on left padding).

**Empty prompt.** The model needs at least one token to predict from, so an empty prompt
starts from the vocabulary's first character (``"\\n"`` for the example model, whose text is
paragraphs: generation then begins as at the start of a paragraph). That character is input,
not output: it is not part of the generated text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gantry.core import InvalidInput
from gantry.serving.errors import BadRequest, ModelFailed

#: The key of the model signature that makes a model generative.
SIGNATURE_KEY = "generation"


@dataclass(frozen=True)
class Generation:
    """A generative model's vocabulary (character ``i`` is token ``i``) and context length
    (tokens the model reads at once). Invalid values raise :class:`~gantry.core.InvalidInput`.
    """

    vocabulary: str
    context: int
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.vocabulary, str) or not self.vocabulary:
            raise InvalidInput(
                f"a generative model's vocabulary must be a non-empty string, "
                f"not {self.vocabulary!r}"
            )
        repeated = sorted({c for c in self.vocabulary if self.vocabulary.count(c) > 1})
        if repeated:
            raise InvalidInput(
                f"a generative model's vocabulary repeats {', '.join(map(repr, repeated))}: "
                "each character must be one token"
            )
        if isinstance(self.context, bool) or not isinstance(self.context, int):
            raise InvalidInput(
                f"a generative model's context must be an integer, not {self.context!r}"
            )
        if self.context <= 0:
            raise InvalidInput(f"a generative model's context must be > 0, not {self.context}")
        object.__setattr__(self, "_index", {c: i for i, c in enumerate(self.vocabulary)})

    @classmethod
    def from_signature(cls, signature: Mapping[str, Any]) -> Generation | None:
        """The signature's ``generation`` entry; None when the model is not generative."""
        raw = signature.get(SIGNATURE_KEY)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise InvalidInput(
                f"signature.generation must be an object like "
                f'{{"vocabulary": "...", "context": 64}}, not {type(raw).__name__}'
            )
        unknown = sorted(set(raw) - {"vocabulary", "context"})
        missing = sorted({"vocabulary", "context"} - set(raw))
        if unknown or missing:
            problem = f"lacks {', '.join(missing)}" if missing else f"has {', '.join(unknown)}"
            raise InvalidInput(
                f"signature.generation {problem}: it holds exactly vocabulary and context"
            )
        return cls(vocabulary=raw["vocabulary"], context=raw["context"])

    @property
    def size(self) -> int:
        """The number of tokens (the length of the logits' last dimension)."""
        return len(self.vocabulary)

    def encode(self, text: str) -> list[int]:
        """``text`` as token ids; a character outside the vocabulary is a :class:`BadRequest`
        naming it."""
        index = self._index
        try:
            return [index[c] for c in text]
        except KeyError as exc:
            char = exc.args[0]
            raise BadRequest(
                f"the prompt holds {char!r} (at position {text.index(char)}), which the "
                f"model's vocabulary does not: it knows only {self.vocabulary!r}"
            ) from None

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Token ids back to text."""
        vocabulary, size = self.vocabulary, len(self.vocabulary)
        out = []
        for token in ids:
            i = int(token)
            if not 0 <= i < size:
                raise BadRequest(f"token id {i} is outside the vocabulary (0..{size - 1})")
            out.append(vocabulary[i])
        return "".join(out)

    def window(self, ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """The model input for the text so far, and the position whose logits predict the next
        token: ``(1, context)`` int64 holding the last ``context`` ids left-aligned, then zeros
        (causal attention: the padding does not change the logits up to that position). No
        ids (an empty prompt) reads as the vocabulary's first character."""
        kept = list(ids[-self.context :]) if len(ids) else [0]
        window = np.zeros((1, self.context), dtype=np.int64)
        window[0, : len(kept)] = kept
        if window.min() < 0 or window.max() >= len(self.vocabulary):
            raise BadRequest(
                f"token ids must lie in 0..{len(self.vocabulary) - 1}; got "
                f"{int(window.min())}..{int(window.max())}"
            )
        return window, len(kept) - 1

    def sample(self, logits_row: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
        """The next token from one position's logits: the most likely at ``temperature`` 0,
        else drawn from ``softmax(logits / temperature)`` (computed stably, in float64)."""
        if not math.isfinite(temperature) or temperature < 0:
            raise BadRequest(f"temperature must be a finite number >= 0, not {temperature}")
        logits = np.asarray(logits_row, dtype=np.float64).reshape(-1)
        if logits.size == 0:
            raise ModelFailed("the model returned no logits to sample from")
        top = float(logits.max())
        if np.isnan(logits).any() or not math.isfinite(top):
            raise ModelFailed("the model returned logits that are NaN or all infinite")
        if temperature == 0:
            return int(np.argmax(logits))
        # (logits - max) <= 0 before dividing: exp never overflows, even for tiny temperatures
        weights = np.exp((logits - top) / temperature)
        cumulative = np.cumsum(weights)
        pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        return min(pick, logits.size - 1)


__all__ = ["SIGNATURE_KEY", "Generation"]
