"""Where a step's time goes: the phases the runtime reports to the profiler, and what it counts."""

from __future__ import annotations

import time

import torch

from gantry.training.progress import ProgressReporter
from gantry.training.trainer import (
    StepMetrics,
    Trainer,
    TrainingOptions,
    WorkerEnv,
    _batch_counts,
    _GradClock,
    _HostMark,
    _marks_for,
    _Phases,
)


def test_tokens_are_counted_for_sequences_only() -> None:
    ids = torch.zeros(4, 7, dtype=torch.long)
    assert _batch_counts((ids, ids)) == (4, 28)
    embedded = torch.zeros(4, 7, 3)
    assert _batch_counts((embedded, ids)) == (4, 28)
    rows = torch.zeros(4, 10)
    assert _batch_counts((rows, ids)) == (4, 0)
    images = torch.zeros(4, 3, 8, 8)
    assert _batch_counts((images, ids)) == (4, 0)  # channels are not tokens
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert _batch_counts(({"input_ids": mask, "attention_mask": mask}, ids)) == (2, 3)
    assert _batch_counts("not a batch") == (0, 0)


def test_the_wait_after_the_last_gradient_is_communication() -> None:
    clock = _GradClock()
    phases = _Phases(clock)
    phases.batch_arrived((torch.zeros(2, 3), torch.zeros(2)))
    time.sleep(0.01)
    phases.forwarded()
    time.sleep(0.02)  # backward computing...
    clock._ready(torch.zeros(1))  # ...its last gradient is ready (the parameter hook)...
    time.sleep(0.03)  # ...and the all-reduce is waited for
    phases.backwarded(synced=True)
    phases.optimized()
    time.sleep(0.01)  # the agreement between ranks at the end of the step
    out = phases.end()
    # lower bounds only (a busy machine only adds time): each phase got its own sleep, so
    # none was lumped into another
    assert out.forward_s >= 0.01
    assert out.backward_s >= 0.02
    assert out.comm_s >= 0.04
    assert out.step_s >= out.data_s + out.forward_s + out.backward_s + out.comm_s
    # a micro-batch without gradient sync has no communication to wait for
    phases.batch_arrived((torch.zeros(2, 3), torch.zeros(2)))
    phases.forwarded()
    time.sleep(0.01)
    clock._ready(torch.zeros(1))
    time.sleep(0.01)
    phases.backwarded(synced=False)
    phases.optimized()
    out = phases.end()
    assert out.backward_s >= 0.02 and out.comm_s < out.backward_s


def test_marks_are_cuda_events_on_a_gpu() -> None:
    assert _marks_for(torch.device("cpu")) is _HostMark
    mark = _HostMark()
    mark.record()
    later = _HostMark()
    later.t = mark.t + 0.5
    assert mark.elapsed_time(later) == 500.0  # milliseconds, as torch.cuda.Event answers
    if torch.cuda.is_available():
        event = _marks_for(torch.device("cuda"))()
        assert isinstance(event, torch.cuda.Event)


def test_a_run_reports_every_phase_in_its_windows(tmp_path: object) -> None:
    seen: list[StepMetrics] = []
    records: list[dict[str, object]] = []
    reporter = ProgressReporter(window_steps=5, min_window_s=0.0)
    reporter.send = records.append  # type: ignore[method-assign]
    reporter._send = records.append  # type: ignore[method-assign]

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def dataset() -> torch.utils.data.TensorDataset:
        x = torch.randn(64, 4)
        return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))

    trainer = Trainer(
        model,
        torch.nn.functional.mse_loss,
        dataset,
        options=TrainingOptions(epochs=1, micro_batch_size=8, max_steps=8),
        env=WorkerEnv(),
        callbacks=[seen.append, reporter],
    )
    trainer.fit()
    reporter.close()
    assert len(seen) == 8
    for m in seen:
        assert m.forward_s > 0 and m.backward_s > 0 and m.samples == 8
        assert m.compute_s == m.forward_s + m.backward_s
        assert m.step_s >= m.data_s + m.compute_s + m.optimizer_s
    windows = [r for r in records if r.get("kind") == "steps"]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(1, 5), (6, 8)]
    for w in windows:
        assert {"forward_ms", "backward_ms", "comm_ms", "tokens"} <= set(w)
