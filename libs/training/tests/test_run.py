"""``python -m gantry.training.run``, run as the node agent runs it: a real worker process with
the agent's environment (data dir, job id, checkpoint and output dirs, a progress pipe) and a
small task module on PYTHONPATH. It trains and exports, reports progress, maps failures to
its exit codes, and stops on SIGTERM with a checkpoint that a rerun resumes from."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from gantry.training.run import EXIT_CONFIG, EXIT_USER_ERROR

TIMEOUT_S = 60
SAMPLES = 256
BATCH = 32

TINY_TASK = f"""
    import torch
    from torch.utils.data import TensorDataset
    from gantry.training.task import Task

    def model():
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def dataset(ctx):
        g = torch.Generator().manual_seed(ctx.seed)
        x = torch.randn({SAMPLES}, 8, generator=g)
        return TensorDataset(x, torch.tanh(x.sum(dim=1, keepdim=True) / 4))

    task = Task(
        model=model,
        loss=torch.nn.functional.mse_loss,
        dataset=dataset,
        eval_dataset=dataset,
        options={{"micro_batch_size": {BATCH}, "epochs": 2, "lr": 0.01, "device": "cpu"}},
        model_name="tiny",
        description="a tiny regression",
        generation={{"vocabulary": "01", "context": 8}},  # copied into the signature as it is
    )
"""

BROKEN_TASK = """
    raise RuntimeError("tinytask cannot find its vocabulary file")
"""


#: The same regression, not registered, with its own evaluate() (an accuracy-like metric).
UNREGISTERED_TASK = TINY_TASK.replace(
    '        model_name="tiny",',
    """        model_name="tiny",
        register=False,
        evaluate=lambda model, ctx: {
            "close": float((model(torch.ones(4, 8)) - 0.96).abs().lt(0.5).float().mean()),
            "skipped": float("nan"),
        },""",
)


class Worker:
    """A running ``gantry.training.run`` process and the records it sends on its pipe."""

    def __init__(self, home: Path, reference: str, args: Sequence[str], env: dict[str, str]):
        read_end, write_end = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gantry.training.run", reference, *args],
            env={**env, "GANTRY_PROGRESS_FD": str(write_end)},
            pass_fds=(write_end,),
            cwd=home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(write_end)  # the worker holds the only write end: EOF when it exits
        self.records: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(read_end,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r") as pipe:
            for line in pipe:
                with self._changed:
                    self.records.append(json.loads(line))
                    self._changed.notify_all()

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first record matching ``predicate``, waiting for it (the worker must run)."""
        deadline = time.monotonic() + TIMEOUT_S
        with self._changed:
            while True:
                found = next((r for r in self.records if predicate(r)), None)
                if found is not None:
                    return found
                assert self.process.poll() is None, "the worker exited before the record came"
                assert time.monotonic() < deadline, "no such record within the timeout"
                self._changed.wait(timeout=0.2)

    def finish(self) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the worker exits; it is killed past the timeout."""
        try:
            out, err = self.process.communicate(timeout=TIMEOUT_S)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate()
        self._reader.join(timeout=5)
        return self.process.returncode, out, err

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


class Agent:
    """What the node agent gives a worker: directories and an environment."""

    def __init__(self, root: Path, task_source: str = TINY_TASK) -> None:
        self.root = root
        self.tasks = root / "tasks"
        self.tasks.mkdir(parents=True)
        (self.tasks / "tinytask.py").write_text(textwrap.dedent(task_source))
        self.checkpoints = root / "checkpoints"
        self.output = root / "output"

    def environ(self, **extra: str) -> dict[str, str]:
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("GANTRY_")
            and k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
        }
        return inherited | {
            "PYTHONPATH": str(self.tasks),
            "OMP_NUM_THREADS": "1",
            "GANTRY_DATA_DIR": str(self.root / "data"),
            "GANTRY_JOB_ID": "job-tiny",
            "GANTRY_CHECKPOINT_DIR": str(self.checkpoints),
            "GANTRY_OUTPUT_DIR": str(self.output),
            "GANTRY_LOG_JSON": "false",
            **extra,
        }

    def start(self, reference: str = "tinytask:task", *args: str, **extra: str) -> Worker:
        return Worker(self.root, reference, args, self.environ(**extra))

    def evaluate(self, model_dir: Path | None, *args: str, **extra: str) -> Worker:
        env = {"GANTRY_MODEL_DIR": str(model_dir)} if model_dir is not None else {}
        return Worker(
            self.root, "--evaluate", ("tinytask:task", *args), self.environ(**env, **extra)
        )


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    return Agent(tmp_path)


def test_a_task_trains_exports_and_reports_progress(agent: Agent) -> None:
    worker = agent.start()
    code, out, err = worker.finish()

    assert code == 0, err
    total = 2 * SAMPLES // BATCH
    assert f"finished after {total} steps: eval_loss=" in out
    assert "exported tiny as torch.export (model.pt2)" in out

    progress = worker.of_kind("progress")
    steps = [r["step"] for r in progress]
    assert steps[0] == 1 and steps[-1] == total  # the first step and the last are always sent
    assert steps == sorted(set(steps))
    assert all(r["total_steps"] == total for r in progress)
    assert all(r["loss"] > 0 and r["samples_per_s"] > 0 for r in progress)
    assert progress[-1]["eta_s"] == 0 and progress[-1]["epoch"] == 1

    windows = worker.of_kind("steps")
    assert windows and windows[-1]["last_step"] == total
    covered = [s for w in windows for s in range(w["first_step"], w["last_step"] + 1)]
    assert covered == list(range(1, total + 1))  # every step in exactly one window
    assert sum(w["samples"] for w in windows) == total * BATCH
    for window in windows:
        assert window["step_ms"] > 0 and window["step_ms_max"] >= window["step_ms"]
        assert window["compute_ms"] > 0 and window["memory_mib"] > 0
        assert window["data_ms"] + window["compute_ms"] + window["optimizer_ms"] <= (
            window["step_ms"] * 1.01 + 0.01
        )

    manifest = json.loads((agent.output / "model.json").read_text())
    assert manifest["name"] == "tiny" and manifest["description"] == "a tiny regression"
    assert (manifest["artifact"], manifest["format"]) == ("model.pt2", "torch.export")
    assert set(manifest["metrics"]) == {"final_loss", "eval_loss"}
    assert 0 < manifest["metrics"]["eval_loss"] < 1
    # the same numbers in metrics.json, which the agent reports with the job's success
    assert json.loads((agent.output / "metrics.json").read_text()) == manifest["metrics"]
    assert manifest["code_version"].split()[-1].startswith("sha256:")
    assert manifest["signature"]["inputs"] == [{"shape": [-1, 8], "dtype": "float32"}]
    assert manifest["signature"]["generation"] == {"vocabulary": "01", "context": 8}
    model = torch.export.load(str(agent.output / "model.pt2")).module()
    assert model(torch.randn(5, 8)).shape == (5, 1)
    # a finished run was not stopped: no stop checkpoint, so no marker
    assert not (agent.checkpoints / "step").exists()


def test_an_unregistered_model_still_leaves_its_metrics(tmp_path: Path) -> None:
    agent = Agent(tmp_path, UNREGISTERED_TASK)
    code, out, err = agent.start("tinytask:task", "epochs=1").finish()

    assert code == 0, err
    assert "finished after 8 steps: close=" in out
    assert not (agent.output / "model.json").exists()  # register=False: nothing exported
    metrics = json.loads((agent.output / "metrics.json").read_text())
    assert set(metrics) == {"final_loss", "close"}  # NaN metrics are left out
    assert 0 <= metrics["close"] <= 1 and metrics["final_loss"] > 0


# -- evaluation: an exported model, evaluated by the task, nothing trained -----------------------


def exported_model(directory: Path, *, torchscript: bool = False) -> torch.nn.Module:
    """A model of the tiny task's shape, exported as a job exports it (with model.json)."""
    from gantry.training.export import ModelManifest, export_model

    torch.manual_seed(3)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    if torchscript:
        directory.mkdir(parents=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module.eval(), torch.randn(2, 8))  # type: ignore[no-untyped-call]
            torch.jit.save(traced, str(directory / "model.ts"))
        artifact, fmt = "model.ts", "torchscript"
    else:
        artifact, fmt, _ = export_model(module, torch.randn(2, 8), directory)
    ModelManifest(name="tiny", artifact=artifact, format=fmt).write(directory)
    return module.eval()


def tiny_eval_loss(module: torch.nn.Module, seed: int = 0) -> float:
    """The tiny task's eval_loss of ``module``, computed here as the runtime should."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 8, generator=g)
    y = torch.tanh(x.sum(dim=1, keepdim=True) / 4)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(module(x), y))


@pytest.mark.parametrize("torchscript", [False, True], ids=["torch.export", "torchscript"])
def test_evaluate_loads_the_exported_model_and_writes_only_metrics(
    agent: Agent, tmp_path: Path, torchscript: bool
) -> None:
    module = exported_model(tmp_path / "model", torchscript=torchscript)
    worker = agent.evaluate(tmp_path / "model")
    code, out, err = worker.finish()

    assert code == 0, err
    assert f"evaluating model tiny ({tmp_path / 'model'}) on cpu" in out
    assert "evaluated tiny: eval_loss=" in out
    metrics = json.loads((agent.output / "metrics.json").read_text())
    assert set(metrics) == {"eval_loss"}  # no final_loss: nothing was trained
    assert metrics["eval_loss"] == pytest.approx(tiny_eval_loss(module), rel=1e-5)
    assert not worker.of_kind("progress") and not worker.of_kind("steps")
    assert sorted(p.name for p in agent.output.iterdir()) == ["metrics.json"]  # no model
    assert not agent.checkpoints.exists()  # and no checkpoint


def test_evaluate_without_a_model_or_with_a_broken_one_is_a_config_error(
    agent: Agent, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.pt2").write_bytes(b"not a zip archive")
    (broken / "model.json").write_text(
        json.dumps({"name": "tiny", "artifact": "model.pt2", "format": "torch.export"})
    )
    workers = {
        "unset": agent.evaluate(None),
        "empty": agent.evaluate(tmp_path),
        "broken": agent.evaluate(broken),
    }
    results = {name: w.finish() for name, w in workers.items()}
    for name, (code, _out, err) in results.items():
        assert code == EXIT_CONFIG, (name, err)
        assert err.splitlines()[-1].startswith("gantry: error: "), (name, err)  # not a crash
    assert "GANTRY_MODEL_DIR is not set" in results["unset"][2]
    assert "holds no model.json" in results["empty"][2]
    assert "cannot load model.pt2 of model tiny as torch.export" in results["broken"][2]
    assert not (agent.output / "metrics.json").exists()


# -- failures: their exit codes, started together to share the CPUs ------------------------------


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """(exit code, stderr) of each failing start, from workers run side by side."""
    good = Agent(tmp_path_factory.mktemp("good"))
    broken = Agent(tmp_path_factory.mktemp("broken"), BROKEN_TASK)
    workers = {
        "missing module": good.start("tinytusk:task"),
        "import raises": broken.start(),
        "bad override": good.start("tinytask:task", "epochs=2", "bogus=1"),
    }
    results = {}
    for name, worker in workers.items():
        code, _, err = worker.finish()
        results[name] = (code, err)
    return results


def test_a_module_that_does_not_exist_is_the_users_error(
    failures: dict[str, tuple[int, str]],
) -> None:
    code, err = failures["missing module"]
    assert code == EXIT_USER_ERROR == 1
    assert "ModuleNotFoundError: No module named 'tinytusk'" in err


def test_a_module_raising_at_import_shows_the_users_traceback(
    failures: dict[str, tuple[int, str]],
) -> None:
    code, err = failures["import raises"]
    assert code == EXIT_USER_ERROR
    assert "Traceback (most recent call last)" in err
    assert "tinytask.py" in err
    assert "RuntimeError: tinytask cannot find its vocabulary file" in err


def test_an_unknown_option_exits_2_with_a_clear_message(
    failures: dict[str, tuple[int, str]],
) -> None:
    code, err = failures["bad override"]
    assert code == EXIT_CONFIG == 2
    assert "gantry: error: unknown task option 'bogus'" in err
    assert "Traceback" not in err  # a configuration error is not a crash


def test_no_arguments_is_a_usage_error() -> None:
    from gantry.training.run import main

    assert main([]) == EXIT_CONFIG


# -- SIGTERM, then resume ------------------------------------------------------------------------


def test_sigterm_checkpoints_and_a_rerun_resumes_from_that_step(agent: Agent) -> None:
    long = agent.start("tinytask:task", "epochs=1000")  # 8000 steps: far longer than the test
    long.wait_for(lambda r: r["kind"] == "progress")
    long.process.send_signal(signal.SIGTERM)
    code, out, err = long.finish()

    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("stopped at step "))
    stopped = int(line.split()[3].rstrip(";"))
    assert line == f"stopped at step {stopped}; checkpoint saved"
    assert 1 <= stopped < 8000
    assert (agent.checkpoints / "step").read_text() == f"{stopped}\n"
    assert not (agent.output / "model.json").exists()  # a stopped job exports nothing
    last = max(r["step"] for r in long.of_kind("progress"))
    assert last <= stopped

    rerun = agent.start("tinytask:task", "epochs=1000", f"max_steps={stopped + 8}",
                        GANTRY_RESUME="1")  # fmt: skip
    code, out, err = rerun.finish()

    assert code == 0, err
    steps = [r["step"] for r in rerun.of_kind("progress")]
    assert steps[0] == stopped + 1  # it continued, it did not start again
    assert steps[-1] == stopped + 8
    assert f"finished after {stopped + 8} steps" in out
    assert (agent.output / "model.json").is_file()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("fsdp", ["false", "true"])
def test_two_workers_train_and_rank_0_exports_the_whole_model(agent: Agent, fsdp: str) -> None:
    """DDP, or FSDP whose sharded model every rank helps gather before rank 0 exports it."""
    port = str(_free_port())
    workers = [
        agent.start(
            "tinytask:task",
            f"fsdp={fsdp}",
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        for rank in range(2)
    ]
    results = [w.finish() for w in workers]
    for code, _out, err in results:
        assert code == 0, err[-2000:]
    manifest = json.loads((agent.output / "model.json").read_text())
    assert manifest["name"] == "tiny" and manifest["metrics"]["eval_loss"] < 0.5
    assert "finished after 8 steps" in results[0][1]  # 2 epochs of 256 / (32 x 2)


# -- evaluation during training (eval_every) ----------------------------------------------------


def test_eval_every_sends_an_evaluation_after_each_epoch(agent: Agent) -> None:
    worker = agent.start("tinytask:task", "eval_every=1")
    code, out, err = worker.finish()

    assert code == 0, err
    evaluations = worker.of_kind("evaluation")
    assert [(r["epoch"], r["step"]) for r in evaluations] == [(1, 8), (2, 16)]
    assert all(set(r) == {"kind", "step", "epoch", "metrics"} for r in evaluations)
    losses = [r["metrics"]["eval_loss"] for r in evaluations]
    assert all(set(r["metrics"]) == {"eval_loss"} for r in evaluations)
    assert 0 < losses[1] < losses[0] < 1  # it learns
    printed = [line for line in out.splitlines() if line.startswith("eval epoch")]
    assert printed == [
        f"eval epoch {e}: eval_loss={v:.4g}" for e, v in ((1, losses[0]), (2, losses[1]))
    ]
    # the last epoch's evaluation is the final one: the same model, not evaluated twice
    metrics = json.loads((agent.output / "metrics.json").read_text())
    assert metrics["eval_loss"] == losses[1]
    assert f"finished after 16 steps: eval_loss={losses[1]:.4g}" in out
