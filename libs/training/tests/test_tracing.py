"""Deep traces on request: a real Trainer run records the asked-for steps with torch.profiler
and leaves a gzipped Chrome trace and its done file; ids are handled once, other ranks record
nothing, the idle check is paced, and a failing profiler reports instead of stopping training."""

from __future__ import annotations

import gzip
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from gantry.training import tracing
from gantry.training.tracing import REQUEST_FILE, TraceOnRequest, done_file, trace_file
from gantry.training.trainer import StepMetrics, Trainer, TrainingOptions, WorkerEnv


def regression() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 8, generator=g)
    return TensorDataset(x, torch.tanh(x.sum(dim=1, keepdim=True) / 3))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def fit(max_steps: int, *callbacks: Any) -> list[int]:
    """Train for ``max_steps`` steps on one CPU worker; the steps the callbacks saw."""
    steps: list[int] = []
    options = TrainingOptions(micro_batch_size=16, epochs=10, max_steps=max_steps, device="cpu")
    trainer = Trainer(
        mlp,
        mse,
        regression,
        options=options,
        env=WorkerEnv(),
        callbacks=[lambda m: steps.append(m.step), *callbacks],
    )
    trainer.fit()
    return steps


def request(trace_dir: Path, trace_id: str, steps: int, ranks: list[int] | None = None) -> None:
    """Write a request the way the agent does: a temporary name, then a rename."""
    tmp = trace_dir / ".request.tmp"
    tmp.write_text(json.dumps({"trace_id": trace_id, "steps": steps, "ranks": ranks or []}))
    tmp.replace(trace_dir / REQUEST_FILE)


def done(trace_dir: Path, trace_id: str, rank: int = 0) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(done_file(trace_dir, trace_id, rank).read_text())
    return record


def events(trace_dir: Path, trace_id: str, rank: int = 0) -> list[dict[str, Any]]:
    with gzip.open(trace_file(trace_dir, trace_id, rank), "rt") as f:
        trace = json.load(f)
    assert isinstance(trace["traceEvents"], list)
    return list(trace["traceEvents"])


def metrics(step: int, *, rank: int = 0, total_steps: int = 0) -> StepMetrics:
    return StepMetrics(step, 0, 0.5, 100.0, None, rank, total_steps=total_steps)


def work() -> None:
    torch.randn(16, 16) @ torch.randn(16, 16)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def leftovers(trace_dir: Path) -> list[str]:
    """Temporary files a trace left behind (there must be none)."""
    return sorted(p.name for p in trace_dir.iterdir() if p.name.startswith("."))


# -- a real training run ----------------------------------------------------------------------


def test_a_request_written_before_the_run_records_the_next_steps(tmp_path: Path) -> None:
    request(tmp_path, "t-before", 3)
    tracer = TraceOnRequest(tmp_path)
    fit(8, tracer)
    # the request is first seen after step 1: steps 2, 3 and 4 are recorded
    assert done(tmp_path, "t-before") == {
        "trace_id": "t-before",
        "rank": 0,
        "first_step": 2,
        "steps": 3,
        "bytes": trace_file(tmp_path, "t-before", 0).stat().st_size,
        "failed_reason": "",
    }
    recorded = events(tmp_path, "t-before")
    assert len(recorded) > 10
    names = {e.get("name", "") for e in recorded}
    assert any("aten::" in n for n in names)  # the model's operators are in it
    assert not tracer.recording
    assert leftovers(tmp_path) == []


def test_a_request_written_while_it_runs_is_recorded_once_per_trace_id(tmp_path: Path) -> None:
    gz, marker = trace_file(tmp_path, "t-live", 0), done_file(tmp_path, "t-live", 0)
    started: list[int] = []

    def agent(m: StepMetrics) -> None:  # plays the agent, before the tracer sees each step
        if m.step == 5:
            request(tmp_path, "t-live", 4)
        if m.step == 12:  # uploaded and removed; the same request again
            started.append(m.step)
            gz.unlink()
            marker.unlink()
            request(tmp_path, "t-live", 4)
        if m.step == 18:
            request(tmp_path, "t-next", 2)

    tracer = TraceOnRequest(tmp_path, check_s=0.0)
    fit(24, agent, tracer)

    assert started == [12]
    assert not gz.exists() and not marker.exists()  # the repeated id recorded nothing
    # the next one was: seen at step 18, steps 19 and 20
    assert done(tmp_path, "t-next")["first_step"] == 19
    assert done(tmp_path, "t-next")["steps"] == 2
    assert events(tmp_path, "t-next")


def test_the_first_trace_of_a_live_run_starts_after_the_step_it_was_seen(
    tmp_path: Path,
) -> None:
    def agent(m: StepMetrics) -> None:
        if m.step == 5:
            request(tmp_path, "t-five", 4)

    fit(12, agent, TraceOnRequest(tmp_path, check_s=0.0))
    record = done(tmp_path, "t-five")
    assert (record["first_step"], record["steps"], record["failed_reason"]) == (6, 4, "")
    assert record["bytes"] == trace_file(tmp_path, "t-five", 0).stat().st_size > 0


def test_a_run_ending_before_the_steps_exports_what_it_recorded(tmp_path: Path) -> None:
    request(tmp_path, "t-short", 50)
    fit(5, TraceOnRequest(tmp_path))
    record = done(tmp_path, "t-short")
    assert (record["first_step"], record["steps"]) == (2, 4)
    assert events(tmp_path, "t-short")


# -- the callback alone -----------------------------------------------------------------------


def test_close_exports_a_trace_in_progress(tmp_path: Path) -> None:
    request(tmp_path, "t-close", 10)
    tracer = TraceOnRequest(tmp_path)
    tracer(metrics(7))
    assert tracer.recording
    for step in (8, 9):
        work()
        tracer(metrics(step))
    assert not done_file(tmp_path, "t-close", 0).exists()  # nothing before it is finished
    tracer.close()
    assert not tracer.recording
    record = done(tmp_path, "t-close")
    assert (record["first_step"], record["steps"]) == (8, 2)
    assert events(tmp_path, "t-close")
    tracer.close()  # a second close does nothing


def test_a_rank_not_asked_for_records_nothing(tmp_path: Path) -> None:
    request(tmp_path, "t-ranks", 2, ranks=[0, 2])
    other, asked = TraceOnRequest(tmp_path), TraceOnRequest(tmp_path)
    for step in (1, 2, 3):
        other(metrics(step, rank=1))
        asked(metrics(step, rank=2))
    assert not other.recording
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "request.json",
        "t-ranks.rank2.done.json",
        "t-ranks.rank2.json.gz",
    ]
    assert done(tmp_path, "t-ranks", 2)["rank"] == 2


def test_the_idle_check_stats_at_most_every_half_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request_path = tmp_path / REQUEST_FILE
    stats: list[float] = []
    real_stat = os.stat
    clock = FakeClock()

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if Path(path) == request_path:
            stats.append(clock.now)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    tracer = TraceOnRequest(tmp_path, clock=clock)
    for step in range(1, 201):  # 200 steps of 10 ms, no request file
        tracer(metrics(step))
        clock.now += 0.01
    assert len(stats) == 4  # t = 0, 0.5, 1.0, 1.5
    assert all(b - a >= 0.5 - 1e-9 for a, b in itertools.pairwise(stats))

    # an unchanged request file costs one stat per check, and is read once
    request(tmp_path, "t-idle", 1, ranks=[5])
    reads: list[Path] = []
    real_read = Path.read_text

    def counting_read(self: Path, *args: Any, **kwargs: Any) -> str:
        reads.append(self)
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting_read)
    stats.clear()
    for step in range(201, 401):
        tracer(metrics(step))
        clock.now += 0.01
    assert len(stats) == 4
    assert reads == [request_path]


def test_a_profiler_that_fails_to_start_reports_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    request(tmp_path, "t-broken", 3)
    seen = fit(6, TraceOnRequest(tmp_path))
    assert seen == [1, 2, 3, 4, 5, 6]  # training went on
    record = done(tmp_path, "t-broken")
    assert record["failed_reason"] == "profiler could not start: RuntimeError: no profiler here"
    assert (record["first_step"], record["steps"], record["bytes"]) == (2, 0, 0)
    assert not trace_file(tmp_path, "t-broken", 0).exists()


class _FailingExport:
    """A profiler that records, then cannot export."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.steps = 0

    def start(self) -> None:
        pass

    def step(self) -> None:
        self.steps += 1

    def stop(self) -> None:
        pass

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text('{"traceEvents": [')  # half written
        raise OSError(28, "No space left on device")


def test_a_trace_that_cannot_be_exported_reports_why_and_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.profiler, "profile", _FailingExport)
    request(tmp_path, "t-full", 2)
    tracer = TraceOnRequest(tmp_path)
    for step in (1, 2, 3, 4):
        tracer(metrics(step))
    record = done(tmp_path, "t-full")
    assert "could not be exported: OSError" in record["failed_reason"]
    assert "No space left on device" in record["failed_reason"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "request.json",
        "t-full.rank0.done.json",
    ]


def test_a_profiler_failing_mid_trace_reports_and_stops_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class FailingStep(_FailingExport):
        def step(self) -> None:
            raise RuntimeError("kineto gave up")

    monkeypatch.setattr(torch.profiler, "profile", FailingStep)
    request(tmp_path, "t-mid", 5)
    tracer = TraceOnRequest(tmp_path)
    tracer(metrics(1))
    tracer(metrics(2))
    assert not tracer.recording
    assert done(tmp_path, "t-mid")["failed_reason"] == (
        "profiler failed at step 2: RuntimeError: kineto gave up"
    )


def test_bad_requests_are_ignored(tmp_path: Path) -> None:
    tracer = TraceOnRequest(tmp_path, check_s=0.0)
    (tmp_path / REQUEST_FILE).write_text("{not json")
    tracer(metrics(1))
    request(tmp_path, "../escape", 2)
    tracer(metrics(2))
    request(tmp_path, "t-zero", 0)
    tracer(metrics(3))
    assert not tracer.recording
    assert sorted(p.name for p in tmp_path.iterdir()) == [REQUEST_FILE]


def test_from_environ_needs_the_agents_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GANTRY_TRACE_DIR", raising=False)
    assert TraceOnRequest.from_environ() is None
    monkeypatch.setenv("GANTRY_TRACE_DIR", str(tmp_path))
    tracer = TraceOnRequest.from_environ()
    assert tracer is not None and tracer.trace_dir == tmp_path


def test_the_module_does_not_import_the_profiler_itself() -> None:
    source = Path(tracing.__file__).read_text()
    top_level = [line for line in source.splitlines() if line.startswith(("import", "from"))]
    assert not [line for line in top_level if "profiler" in line]
