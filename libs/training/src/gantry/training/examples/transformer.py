"""Example job: a small causal transformer language model over characters.

The text ships with the package as code: :func:`corpus` writes about 250 KB of sentences from
a small English-like grammar (a village of millers, sailors and foxes who see, mend and
carry things near rivers and bridges), with number agreement between subject and verb,
relative clauses, questions and paragraphs. A fixed seed makes it the same text everywhere;
nothing is downloaded. The last tenth is held out.

The model reads 64 characters and predicts each next one: a character embedding plus a
learned position embedding, two pre-norm transformer blocks (d_model 96, 4 heads, causal
attention through ``scaled_dot_product_attention``) and a linear head over the 59-character
alphabet. ``evaluate`` reports the held-out loss in nats per character, its perplexity, and
the perplexity of the unigram baseline (the training text's character frequencies) that the
model has to beat by far.
"""

from __future__ import annotations

import functools
import math
import random
import string
from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import Dataset

from gantry.training import DataContext, Task

ALPHABET = "\n !',.?" + string.ascii_lowercase + string.ascii_uppercase
"""Every character the model knows; character ``ALPHABET[i]`` is token ``i``."""
CONTEXT = 64
"""Characters the model reads at once (the exported model takes exactly this many)."""
D_MODEL = 96
HEADS = 4
LAYERS = 2
CORPUS_CHARS = 250_000
CORPUS_SEED = 1865
HELD_OUT = 0.1
"""The fraction of the text, at its end, kept for evaluation."""
STRIDE = CONTEXT // 2
"""Training windows start every STRIDE characters (so they overlap by half)."""

_DET_ONE = ("the", "a", "every", "one", "that")
_DET_MANY = ("the", "two", "some", "many", "those", "three")
_ADJECTIVES = ("old", "young", "quiet", "tall", "small", "tired", "clever", "brave", "grey")
_NOUNS = (
    ("miller", "millers"),
    ("sailor", "sailors"),
    ("child", "children"),
    ("fox", "foxes"),
    ("baker", "bakers"),
    ("horse", "horses"),
    ("teacher", "teachers"),
    ("wolf", "wolves"),
    ("farmer", "farmers"),
    ("woman", "women"),
)
_THINGS = (
    "bread", "river", "boat", "letter", "song", "field", "bridge", "lamp", "garden",
    "hill", "door", "road", "window", "stone", "apple", "mill", "harbour",
)  # fmt: skip
_STILL = (
    ("sleeps", "sleep"), ("sings", "sing"), ("waits", "wait"), ("laughs", "laugh"),
    ("runs", "run"), ("listens", "listen"), ("rests", "rest"),
)  # fmt: skip
_DOING = (
    ("sees", "see"), ("finds", "find"), ("carries", "carry"), ("paints", "paint"),
    ("mends", "mend"), ("watches", "watch"), ("follows", "follow"), ("opens", "open"),
)  # fmt: skip
_PLACES = ("near", "by", "under", "behind", "across", "beside", "over")
_MANNER = ("slowly", "quietly", "again", "today", "in the rain", "every morning")
_WHEN = ("At dawn", "After the storm", "In the evening", "On market day", "Later")


def corpus() -> str:
    """The example's whole text: the same ~250 KB on every machine (see the module doc)."""
    return _corpus(CORPUS_CHARS, CORPUS_SEED)


@functools.cache
def _corpus(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    paragraphs: list[str] = []
    size = 0
    while size < chars:
        sentences = [_sentence(rng) for _ in range(rng.randint(3, 6))]
        paragraph = " ".join(sentences) + "\n"
        paragraphs.append(paragraph)
        size += len(paragraph)
    return "".join(paragraphs)[:chars]


def _noun_phrase(rng: random.Random) -> tuple[str, bool]:
    """A subject and whether it is plural."""
    plural = rng.random() < 0.4
    one, many = rng.choice(_NOUNS)
    words = [rng.choice(_DET_MANY if plural else _DET_ONE)]
    if rng.random() < 0.5:
        words.append(rng.choice(_ADJECTIVES))
    words.append(many if plural else one)
    return _an(" ".join(words)), plural


def _thing(rng: random.Random) -> str:
    return _an(f"{rng.choice(('the', 'a', 'my', 'her', 'his'))} {rng.choice(_THINGS)}")


def _an(phrase: str) -> str:
    """``a old fox`` -> ``an old fox``."""
    return "an" + phrase[1:] if phrase[:2] == "a " and phrase[2] in "aeiou" else phrase


def _verb_phrase(rng: random.Random, plural: bool) -> str:
    form = 1 if plural else 0
    if rng.random() < 0.45:
        words = [rng.choice(_STILL)[form]]
    else:
        words = [rng.choice(_DOING)[form], _thing(rng)]
    if rng.random() < 0.5:
        words += [rng.choice(_PLACES), _thing(rng)]
    elif rng.random() < 0.5:
        words.append(rng.choice(_MANNER))
    return " ".join(words)


def _sentence(rng: random.Random) -> str:
    subject, plural = _noun_phrase(rng)
    shape = rng.random()
    if shape < 0.15:  # a question: "Do the millers see the boat?"
        verb = rng.choice(_DOING)[1]
        text = f"{'do' if plural else 'does'} {subject} {verb} {_thing(rng)}?"
    elif shape < 0.35:  # a relative clause: "the fox that sees the boat sleeps."
        inner = _verb_phrase(rng, plural)
        text = f"{subject} that {inner} {_verb_phrase(rng, plural)}."
    elif shape < 0.55:  # two clauses
        second, second_plural = _noun_phrase(rng)
        text = (
            f"{subject} {_verb_phrase(rng, plural)}, and {second} "
            f"{_verb_phrase(rng, second_plural)}."
        )
    elif shape < 0.65:
        text = f"{rng.choice(_WHEN)}, {subject} {_verb_phrase(rng, plural)}."
    else:
        text = f"{subject} {_verb_phrase(rng, plural)}."
    return text[0].upper() + text[1:]


def encode(text: str) -> torch.Tensor:
    """``text`` as token ids (int64); every character must be in :data:`ALPHABET`."""
    index = {c: i for i, c in enumerate(ALPHABET)}
    return torch.tensor([index[c] for c in text], dtype=torch.long)


def decode(tokens: torch.Tensor) -> str:
    """Token ids back to text."""
    return "".join(ALPHABET[int(t)] for t in tokens)


def _split(*, held_out: bool) -> torch.Tensor:
    tokens = _tokens()
    cut = int(len(tokens) * (1 - HELD_OUT))
    return tokens[cut:] if held_out else tokens[:cut]


@functools.cache
def _tokens() -> torch.Tensor:
    return encode(corpus())


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """(CONTEXT characters, the same shifted by one) pairs starting every ``stride`` tokens."""

    def __init__(self, tokens: torch.Tensor, stride: int) -> None:
        self.tokens = tokens
        self.stride = stride

    def __len__(self) -> int:
        return (len(self.tokens) - CONTEXT - 1) // self.stride + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.stride
        chunk = self.tokens[start : start + CONTEXT + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then a 4x MLP, each residual."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.out = nn.Linear(D_MODEL, D_MODEL)
        self.mlp_norm = nn.LayerNorm(D_MODEL)
        self.mlp = nn.Sequential(
            nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (batch, time, D_MODEL) through the block."""
        batch, time, _ = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).split(D_MODEL, dim=-1)
        q, k, v = (t.view(batch, time, HEADS, D_MODEL // HEADS).transpose(1, 2) for t in (q, k, v))
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, time, D_MODEL))
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class CharTransformer(nn.Module):
    """Token ids (batch, CONTEXT) in, next-character logits (batch, CONTEXT, alphabet) out."""

    positions: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(ALPHABET), D_MODEL)
        self.position = nn.Embedding(CONTEXT, D_MODEL)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, len(ALPHABET))
        self.register_buffer("positions", torch.arange(CONTEXT), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits of every next character."""
        x = self.embed(tokens) + self.position(self.positions[: tokens.shape[1]])
        logits: torch.Tensor = self.head(self.norm(self.blocks(x)))
        return logits


def model() -> nn.Module:
    """A fresh :class:`CharTransformer`."""
    return CharTransformer()


def next_char_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of every position's next character, in nats."""
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def dataset(ctx: DataContext) -> Windows:
    """Overlapping windows of the training text."""
    return Windows(_split(held_out=False), STRIDE)


def evaluate(model: nn.Module, ctx: DataContext) -> Mapping[str, float]:
    """Held-out loss (nats per character) and perplexity, and the unigram baseline's."""
    held = Windows(_split(held_out=True), CONTEXT)  # side by side: every character once
    inputs = torch.stack([held[i][0] for i in range(len(held))])
    targets = torch.stack([held[i][1] for i in range(len(held))])
    device = next(model.parameters()).device
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(inputs), 128):
            x, y = inputs[start : start + 128], targets[start : start + 128]
            logits = model(x.to(device)).float().cpu()
            total += float(next_char_loss(logits, y)) * y.numel()
    loss = total / targets.numel()
    # The unigram baseline: each character by its frequency in the training text (add-one).
    counts = torch.bincount(_split(held_out=False), minlength=len(ALPHABET)).double() + 1
    log_p = (counts / counts.sum()).log()
    unigram = float(-log_p[targets.reshape(-1)].mean())
    return {
        "eval_loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_char": loss / math.log(2),
        "unigram_perplexity": math.exp(unigram),
    }


task = Task(
    model=model,
    loss=next_char_loss,
    dataset=dataset,
    evaluate=evaluate,
    example_input=lambda: _split(held_out=True)[: 2 * CONTEXT].view(2, CONTEXT),
    options={"epochs": 3, "micro_batch_size": 32, "lr": 3e-3},
    model_name="village-char-lm",
    description="A two-layer character-level transformer over the village grammar text.",
    generation={"vocabulary": ALPHABET, "context": CONTEXT},
)
"""The job's task: ``entrypoint: {task: gantry.training.examples.transformer:task}``."""
