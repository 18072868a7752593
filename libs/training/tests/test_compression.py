"""Gradient compression: the quantiser on its own, then real 2-rank DDP training over gloo.

The distributed tests start two real worker processes running this file as a script (``python
test_compression.py RANK ...``). They meet through a FileStore in a temporary directory, so
there is no port to pick. Each trains the same model once per compression mode inside one
process group, so the seconds a process needs to start torch are paid once, not once per mode.
(Subprocesses rather than ``torch.multiprocessing.spawn``: spawn pickles the worker function by
module name, and under pytest's importlib mode the child cannot import this file by name.)
"""

import gc
import hashlib
import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gantry.core import ConfigError
from gantry.testing.ranks import run_ranks
from gantry.training.compression import (
    DEFAULT_CHUNK_SIZE,
    CompressionHook,
    CompressionStats,
    QuantizedBucket,
    UnknownCompression,
    payload_nbytes,
    quantize,
    quantize_with_feedback,
    register_compression,
)

WORLD = 2
STEPS = 150
POWERSGD_START = 10
WORKER_TIMEOUT_S = 60
MODES = ("none", "fp16", "int8", "int4", "powersgd")


# --- the quantiser, no processes ---------------------------------------------------------------


def _gradient_like(numel: int, seed: int) -> torch.Tensor:
    """Values whose magnitude varies by 1000x from chunk to chunk, as gradients across layers do."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 10.0 ** torch.empty(numel // 100 + 1).uniform_(-4, -1, generator=gen)
    return torch.randn(numel, generator=gen) * magnitude.repeat_interleave(100)[:numel]


def _chunk_scales(bucket: QuantizedBucket) -> torch.Tensor:
    """Each value's chunk scale, flat, ``numel`` long."""
    return bucket.scales.repeat_interleave(bucket.chunk_size)[: bucket.numel]


@pytest.mark.parametrize("bits", [8, 4])
def test_round_trip_error_is_at_most_half_a_step(bits: int) -> None:
    values = _gradient_like(5000, seed=1)  # not a multiple of the chunk size
    bucket = quantize(values, bits=bits)

    error = (bucket.dequantize() - values).abs()

    assert bucket.scales.numel() == math.ceil(5000 / DEFAULT_CHUNK_SIZE)
    assert torch.all(error <= _chunk_scales(bucket) / 2 * (1 + 1e-5))
    chunk_maxima = torch.stack([c.abs().max() for c in values.split(DEFAULT_CHUNK_SIZE)])
    assert torch.allclose(bucket.scales * (127 if bits == 8 else 7), chunk_maxima)


def test_int8_sends_one_byte_per_value() -> None:
    bucket = quantize(_gradient_like(5000, seed=2), bits=8)

    assert bucket.codes.dtype == torch.uint8
    assert bucket.codes.numel() == 5000
    assert bucket.nbytes == payload_nbytes(5000, bits=8) == 5000 + 4 * 10


def test_int4_packs_two_values_per_byte() -> None:
    bucket = quantize(_gradient_like(1001, seed=3), bits=4)

    assert bucket.codes.numel() == 501
    assert bucket.nbytes == payload_nbytes(1001, bits=4) == 501 + 4 * 2


def test_int4_wire_layout_low_nibble_first() -> None:
    # One chunk with max |x| = 7, so the scale is 1 and the codes are the values themselves.
    bucket = quantize(torch.tensor([-7.0, 7.0, 0.0, 3.0, -1.0]), bits=4)

    assert bucket.scales.tolist() == [1.0]
    # code + 8, value 2i in the low nibble: (1, 15) (8, 11) (7, pad 8)
    assert bucket.codes.tolist() == [0xF1, 0xB8, 0x87]
    assert bucket.dequantize().tolist() == [-7.0, 7.0, 0.0, 3.0, -1.0]


@pytest.mark.parametrize("bits", [8, 4])
def test_wire_payload_round_trips(bits: int) -> None:
    values = _gradient_like(3001, seed=4)
    bucket = quantize(values, bits=bits)

    payload = bucket.to_wire()
    back = QuantizedBucket.from_wire(payload, numel=3001, bits=bits, chunk_size=DEFAULT_CHUNK_SIZE)

    assert payload.dtype == torch.uint8
    assert payload.numel() == bucket.nbytes
    assert torch.equal(back.dequantize(), bucket.dequantize())


def test_payload_of_the_wrong_size_is_refused() -> None:
    payload = quantize(torch.ones(100), bits=8).to_wire()

    with pytest.raises(ValueError, match="expected 104 bytes"):
        QuantizedBucket.from_wire(payload[:-1], numel=100, bits=8, chunk_size=DEFAULT_CHUNK_SIZE)


@pytest.mark.parametrize("bits", [8, 4])
def test_error_feedback_keeps_the_cumulative_error_bounded(bits: int) -> None:
    # A steady gradient with a little noise: rounding it the same way every step would make
    # the error of the running sum grow linearly; error feedback must keep it bounded.
    gen = torch.Generator().manual_seed(5)
    steady = _gradient_like(2000, seed=6)
    residual = torch.zeros(2000)
    true_sum, fed_back_sum, plain_sum = torch.zeros(2000), torch.zeros(2000), torch.zeros(2000)
    worst_half_step = torch.zeros(2000)

    for _ in range(200):
        grad = steady + 0.1 * steady.abs() * torch.randn(2000, generator=gen)
        bucket, residual = quantize_with_feedback(grad, residual, bits=bits)
        true_sum += grad
        fed_back_sum += bucket.dequantize()
        plain_sum += quantize(grad, bits=bits).dequantize()
        worst_half_step = torch.maximum(worst_half_step, _chunk_scales(bucket) / 2)

    fed_back_error = (fed_back_sum - true_sum).abs()
    # What was sent over all steps is the truth minus the residual still held back.
    assert torch.allclose(
        fed_back_sum, true_sum - residual, atol=1e-4 * float(true_sum.abs().max())
    )
    assert torch.all(fed_back_error <= worst_half_step * 1.01 + 1e-6)
    assert float((plain_sum - true_sum).abs().sum()) > 20 * float(fed_back_error.sum())


def test_non_finite_gradient_poisons_its_chunk_not_the_residual() -> None:
    grad = torch.ones(2 * DEFAULT_CHUNK_SIZE)
    grad[3] = math.inf

    bucket, residual = quantize_with_feedback(grad, torch.zeros_like(grad), bits=8)
    values = bucket.dequantize()

    assert torch.isnan(values[:DEFAULT_CHUNK_SIZE]).all()  # the step gets skipped by GradScaler
    assert torch.equal(values[DEFAULT_CHUNK_SIZE:], grad[DEFAULT_CHUNK_SIZE:])
    assert torch.isfinite(residual).all()


def test_stats_close_a_step_on_the_last_bucket() -> None:
    stats = CompressionStats("int8")
    assert math.isnan(stats.compression_ratio)

    stats._record(300, 1000, last_bucket=False)
    stats._record(104, 100, last_bucket=True)

    assert (stats.steps, stats.bytes_per_step, stats.fp32_bytes_per_step) == (1, 404, 4400)
    assert stats.compression_ratio == pytest.approx(4400 / 404)


# --- registration, one in-process rank ----------------------------------------------------------


@pytest.fixture
def single_rank(tmp_path: Path) -> Any:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_unknown_mode_is_refused_with_the_modes_to_use() -> None:
    with pytest.raises(UnknownCompression) as caught:
        register_compression(torch.nn.Linear(2, 2), "onebit")

    assert caught.value.mode == "onebit"
    assert "int4" in str(caught.value)


def test_plain_module_is_refused() -> None:
    with pytest.raises(ConfigError, match="DistributedDataParallel"):
        register_compression(torch.nn.Linear(2, 2), "int8")


@pytest.mark.usefixtures("single_rank")
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"powersgd_rank": 0}, "powersgd_rank"),
        ({"powersgd_start_iter": 1}, "powersgd_start_iter"),
        ({"chunk_size": 511}, "chunk_size"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, int], message: str) -> None:
    model = DistributedDataParallel(torch.nn.Linear(2, 2))

    with pytest.raises(ConfigError, match=message):
        register_compression(model, "int8", **kwargs)


@pytest.mark.usefixtures("single_rank")
def test_one_rank_applies_the_dequantised_gradient_and_counts_its_bytes() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 10)  # 3010 values, one bucket
    ddp = DistributedDataParallel(model)
    stats = register_compression(ddp, "int8")
    x = torch.randn(8, 300)

    ddp(x).square().sum().backward()
    reference = torch.nn.Linear(300, 10)
    reference.load_state_dict(model.state_dict())
    reference(x).square().sum().backward()

    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    true = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    assert not torch.equal(grads, true)  # it really went through the quantiser ...
    # ... to int8: no value is further than half a step at the largest scale, max|g| / 127.
    assert torch.all((grads - true).abs() <= float(true.abs().max()) / 254 * (1 + 1e-5))
    assert stats.steps == 1
    assert stats.fp32_bytes_per_step == 3010 * 4
    assert stats.bytes_per_step == payload_nbytes(3010, bits=8) == 3010 + 4 * 6


@pytest.mark.usefixtures("single_rank")
def test_hook_object_registers_and_exposes_its_stats() -> None:
    ddp = DistributedDataParallel(torch.nn.Linear(300, 10))
    hook = CompressionHook("int4")

    hook.register(ddp)
    ddp(torch.randn(8, 300)).sum().backward()

    assert hook.stats is not None
    assert hook.stats.steps == 1
    assert hook.stats.bytes_per_step == payload_nbytes(3010, bits=4) == 1505 + 4 * 6


# --- two ranks, real processes ------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, dict[str, Any]]]:
    """Each rank's results per mode, from one run of two worker processes."""
    tmp = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks share two cores
    return run_ranks(
        lambda rank: [sys.executable, __file__, str(rank), str(tmp / "store"), str(tmp)],
        tmp,
        world=WORLD,
        timeout_s=WORKER_TIMEOUT_S,
        env=env,
    )


def test_ranks_end_with_identical_parameters(two_ranks: list[dict[str, dict[str, Any]]]) -> None:
    for mode in MODES:
        assert two_ranks[0][mode]["digest"] == two_ranks[1][mode]["digest"], mode


@pytest.mark.parametrize("mode", ["fp16", "int8", "int4"])
def test_compressed_training_matches_fp32(
    two_ranks: list[dict[str, dict[str, Any]]], mode: str
) -> None:
    baseline, run = two_ranks[0]["none"], two_ranks[0][mode]

    assert run["final_loss"] < run["initial_loss"] / 5  # it trained
    assert run["final_loss"] == pytest.approx(baseline["final_loss"], rel=0.02)


def test_byte_counts_and_compression_ratios(two_ranks: list[dict[str, dict[str, Any]]]) -> None:
    results = two_ranks[0]
    fp32_bytes = 4 * results["none"]["numel"]

    for mode in MODES:
        assert results[mode]["steps"] == STEPS, mode
        assert results[mode]["fp32_bytes_per_step"] == fp32_bytes, mode
    assert results["none"]["bytes_per_step"] == fp32_bytes
    assert results["fp16"]["compression_ratio"] == 2.0
    assert results["int8"]["compression_ratio"] >= 3.9
    assert results["int4"]["compression_ratio"] >= 7.5


def test_powersgd_trains_and_compresses(two_ranks: list[dict[str, dict[str, Any]]]) -> None:
    run = two_ranks[0]["powersgd"]

    assert run["compression_ratio"] > 1
    assert run["final_loss"] < run["initial_loss"] / 2


# --- the worker ---------------------------------------------------------------------------------


def _train(mode: str, rank: int) -> dict[str, Any]:
    """Train a small MLP on a fixed regression task with ``mode``; report loss, bytes, params."""
    data = torch.Generator().manual_seed(0)
    inputs = torch.randn(2048, 32, generator=data)
    teacher = torch.randn(32, 64, generator=data) / 32**0.5, torch.randn(64, 1, generator=data) / 8
    targets = torch.tanh(inputs @ teacher[0]) @ teacher[1]
    targets += 0.01 * torch.randn(targets.shape, generator=data)
    mine = inputs[rank::WORLD], targets[rank::WORLD]

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 1),
    )
    # With this bucket cap DDP starts with one bucket and, after the first step, rebuilds it
    # into two holding the parameters in a new order: error feedback must follow parameters.
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.03)
    stats = register_compression(ddp, mode, powersgd_start_iter=POWERSGD_START)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    def loss_on_all_data() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(inputs), targets))

    initial = loss_on_all_data()
    batches = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        index = torch.randint(0, mine[0].shape[0], (64,), generator=batches)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(mine[0][index]), mine[1][index]).backward()
        optimizer.step()

    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    final = loss_on_all_data()
    # free the DDP wrapper (and its hook state) before the process group goes: torch aborts
    # or hangs when a gloo group is torn down under a live DDP reducer
    del ddp, optimizer
    gc.collect()
    return {
        "initial_loss": initial,
        "final_loss": final,
        "digest": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "numel": params.numel(),
        "steps": stats.steps,
        "bytes_per_step": stats.bytes_per_step,
        "fp32_bytes_per_step": stats.fp32_bytes_per_step,
        "compression_ratio": stats.compression_ratio,
    }


def _worker(rank: int, store: str, out_dir: Path) -> None:
    """One rank: every mode in turn, results to ``out_dir/rank{rank}.json``."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=WORKER_TIMEOUT_S),  # a lost peer ends the run, not a hang
    )
    try:
        results = {mode: _train(mode, rank) for mode in MODES}
    finally:
        gc.collect()
        dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    _worker(int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: gloo's threads may still be winding down, and C++ static
    # destructors racing them abort the process ("terminate called without an active exception")
    os._exit(0)
