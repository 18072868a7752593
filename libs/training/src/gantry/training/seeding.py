"""Deterministic seeding, and capture and restore of every random number generator's state.

A run is reproducible when the same seed gives the same model, the same data order and the same
random draws. The runtime seeds in two phases (see :class:`gantry.training.trainer.Trainer`):

1. ``seed_everything(seed)`` before the model is built, so every rank builds the same initial
   weights (FSDP shards them without broadcasting, so they must already agree);
2. ``seed_everything(derive_seed(seed, "rank", rank))`` afterwards, so per-rank draws (dropout)
   differ between ranks instead of repeating the same masks on every worker.

The data order needs no per-rank seed: ``DistributedSampler`` draws one permutation from the
seed and the epoch and gives each rank its own slice of it.

:func:`capture_rng_state` returns only lists, ints, floats, strings and tensors, so the result
can be saved with ``torch.save`` and read back with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

import numpy as np
import torch

from gantry.core import InvalidInput

_SEED_BITS = 63  # a non-negative int64: what torch.manual_seed and numpy accept everywhere
_NUMPY_SEED_BITS = 32  # np.random.seed takes at most 2**32 - 1


def derive_seed(seed: int, *keys: int | str) -> int:
    """A seed for one independent stream, derived from ``seed`` and ``keys``.

    The same arguments always give the same result, on every machine and Python version (it
    is a hash, not Python's randomised ``hash``); different keys give unrelated seeds, e.g.
    ``derive_seed(seed, "rank", 3)`` or ``derive_seed(seed, epoch, index)``.
    """
    digest = hashlib.blake2b(repr((seed, *keys)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _SEED_BITS)


def seed_everything(seed: int, *, deterministic: bool | None = None) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every GPU).

    ``deterministic=True`` also makes torch refuse nondeterministic kernels (an error instead of
    a silently different result) and sets ``CUBLAS_WORKSPACE_CONFIG`` for cuBLAS when it is not
    set already; ``False`` turns that off again; None leaves it as it is. Determinism costs
    speed on GPUs, so it is off unless asked for.
    """
    if seed < 0:
        raise InvalidInput(f"a seed must be a non-negative integer, got {seed}")
    random.seed(seed)
    np.random.seed(seed % (1 << _NUMPY_SEED_BITS))  # user code draws from the global one
    torch.manual_seed(seed)  # seeds every CUDA device too
    if deterministic is not None:
        set_deterministic(deterministic)


def set_deterministic(enabled: bool) -> None:
    """Make torch use only deterministic algorithms (``enabled``) or any algorithm."""
    if enabled:
        # cuBLAS needs a fixed workspace to be deterministic; it reads this when CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # autotuning picks kernels by timing, which differs from run to run
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(enabled)


def capture_rng_state() -> dict[str, Any]:
    """The state of Python's, NumPy's and torch's generators (CPU and every visible GPU).

    The result holds only plain values and tensors (safe for ``weights_only`` loading); give it
    to :func:`restore_rng_state` to continue the same random sequences later.
    """
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    if not isinstance(numpy_state, dict):  # pragma: no cover - legacy=False always gives a dict
        raise TypeError("numpy returned a legacy generator state")
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(numpy_state["state"]["key"], dtype=np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        # read only once initialised: a CPU job on a GPU node must not start CUDA for this
        "cuda": torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        else [],
    }
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back generator states captured by :func:`capture_rng_state`.

    GPU states are restored only when as many GPUs are visible as when they were captured;
    otherwise (a job resumed on another node shape) the GPU generators keep their seeding.
    """
    try:
        python = state["python"]
        random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
        numpy = state["numpy"]
        np.random.set_state(
            {
                "bit_generator": numpy["bit_generator"],
                "state": {
                    "key": np.asarray(numpy["key"], dtype=np.uint32),
                    "pos": numpy["pos"],
                },
                "has_gauss": numpy["has_gauss"],
                "gauss": numpy["gauss"],
            }
        )
        torch.set_rng_state(state["torch"])
        cuda = state["cuda"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(
            f"not a random-generator state captured by capture_rng_state: {exc!r}"
        ) from None
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)


__all__ = [
    "capture_rng_state",
    "derive_seed",
    "restore_rng_state",
    "seed_everything",
    "set_deterministic",
]
