"""The demo's training chapter: a release pipeline that trains a real model on governed data
(preempted and resumed on the way), evaluates it and deploys it only if it is good enough.

1. The data steward registers ``churn`` (a CRM-like table with personal data, the example
   :mod:`gantry.training.examples.tabular` trains on), uploads it and sets its view policy.
2. ``dev-engineer`` submits the pipeline ``churn`` (:func:`pipeline_yaml`): ``model`` trains,
   ``evaluate`` measures the registered model on held-out customers, ``release`` deploys it as
   ``churn-classifier`` through serving — gated on the evaluation's accuracy. The run's first
   step is the job ``churn-model``: the example task on 2 workers (DDP over gloo), reading
   ``churn`` de-identified through the job's grant, low priority, checkpointing every 2 s. Its
   workers train for real; their progress is shown as it arrives.
3. ``rita-researcher`` submits the high-priority ``urgent-eval`` that needs the trusted node's
   4 GPUs: ``churn-model`` checkpoints (SIGTERM at a step boundary), goes back to the queue,
   and resumes from its checkpoint once ``urgent-eval`` is done.
4. ``churn-model`` finishes; its node agent registers the exported model in the governance
   registry, with the job, the dataset version, the code version and the held-out accuracy as
   lineage; the demo reads it back from the registry.
5. The pipeline goes on by itself: ``evaluate`` scores the model, the gate opens, ``release``
   deploys it (the serving chapter takes it from there).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gantry.client.admin import create_token
from gantry.client.demo_data import DEVELOPER, STEWARD
from gantry.client.demo_jobs import QUEUE, RESEARCHER
from gantry.client.governance import GovernanceClient
from gantry.client.model_registry import ModelVersion
from gantry.client.scheduler import JobInfo, SchedulerClient
from gantry.client.specs import ColumnRule, ColumnSpec
from gantry.client.workflows import RunInfo, WorkflowsClient
from gantry.core import IntegrityError, Unavailable

TASK = "gantry.training.examples.tabular:task"
PIPELINE = "churn"
JOB = "churn-model"
"""The pipeline's training step's job (``<pipeline>-<step>``)."""
DEPLOYMENT = "churn-classifier"
MIN_ACCURACY = 0.7
ROWS = 4_000
#: Longest wait for one step of the chapter: the run is 1,500 steps, about 15 s on 2 idle cores
#: but minutes on a busy machine.
WAIT_S = 240.0
POLICY = (
    ColumnRule(classification="public", transform="keep"),
    ColumnRule(classification="internal", transform="keep"),
    ColumnRule(classification="pii", transform="hash"),
    ColumnRule(classification="sensitive", transform="drop"),
)
#: The high-priority job: holds the trusted node's 4 GPUs for a few seconds.
URGENT = "import time; print('evaluating', flush=True); time.sleep(4); print('done', flush=True)"


@dataclass
class TrainingSummary:
    """What the chapter achieved."""

    version: str = ""
    job: JobInfo | None = None
    preempted_at_step: int = 0
    resumed_at_step: int = 0
    attempts: int = 0
    model: ModelVersion | None = None
    lines: list[str] = field(default_factory=list)
    run: RunInfo | None = None
    accuracy: float = 0.0
    deployed: bool = False


def churn_columns() -> list[ColumnSpec]:
    """The example table's columns, from its schema file."""
    from gantry.training.examples.tabular import SCHEMA_YAML

    columns = yaml.safe_load(SCHEMA_YAML)["columns"]
    return [
        ColumnSpec(c["name"], c["type"], c["class"], nullable=c.get("nullable", True))
        for c in columns
    ]


def job_yaml(name: str, *, version: str, epochs: int) -> str:
    """``churn-model``: the tabular example on 2 workers, low priority, reading churn."""
    doc = {
        "apiVersion": "gantry/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "queue": QUEUE, "priority": "low"},
        "spec": {
            "replicas": 2,
            "resources": {"gpus": 1, "gpuModels": ["A100"], "cpus": 1, "memory": "2Gi"},
            "entrypoint": {"task": TASK, "args": [f"epochs={epochs}"]},
            "data": [{"dataset": "churn", "version": version, "view": "deidentified"}],
            "training": {"checkpointInterval": 2},
            "maxRuntime": "15m",
        },
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def pipeline_yaml(*, version: str, epochs: int, canary: Mapping[str, float]) -> str:
    """``churn``: train (``model``, the same job as :func:`job_yaml`), evaluate, release."""
    train = yaml.safe_load(job_yaml(JOB, version=version, epochs=epochs))["spec"]
    analysis = {
        "stepPercent": int(canary.get("step_percent", 0)),
        "maxPercent": int(canary.get("max_percent", 0)),
        "interval": float(canary.get("interval_s", 0)),
        "failureThreshold": int(canary.get("failure_threshold", 0)),
        "minRequests": int(canary.get("min_requests", 0)),
        "minSuccessRate": float(canary.get("min_success_rate", 0)),
        "maxP99Ms": float(canary.get("max_p99_ms", 0)),
    }
    doc = {
        "apiVersion": "gantry/v1",
        "kind": "Pipeline",
        "metadata": {
            "name": PIPELINE,
            "description": "train the churn model, evaluate it, release it if good enough",
        },
        "spec": {
            "queue": QUEUE,
            "params": {"min_accuracy": MIN_ACCURACY},
            "steps": [
                {"name": "model", "priority": "low", "train": train},
                {
                    "name": "evaluate",
                    "evaluate": {
                        "model": "${steps.model.outputs.model}",
                        "resources": {"cpus": 1, "memory": "1Gi"},
                        "entrypoint": {"task": TASK},
                        "data": [{"dataset": "churn", "version": version, "view": "deidentified"}],
                        "maxRuntime": "10m",
                    },
                },
                {
                    "name": "release",
                    "gate": {
                        "metric": "${steps.evaluate.outputs.metrics.accuracy}",
                        "atLeast": "${params.min_accuracy}",
                    },
                    "deploy": {
                        "deployment": DEPLOYMENT,
                        "model": "${steps.evaluate.outputs.model}",
                        "environment": "staging",
                        "maxBatchSize": 16,
                        "maxQueueDelayUs": 2000,
                        "canary": {"percent": 20, **{k: v for k, v in analysis.items() if v}},
                    },
                },
            ],
        },
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def urgent_yaml(version: str) -> str:
    """``urgent-eval``: high priority, all 4 GPUs of the trusted node (it reads churn too)."""
    doc = {
        "apiVersion": "gantry/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "urgent-eval", "queue": QUEUE, "priority": "high"},
        "spec": {
            "replicas": 1,
            "resources": {"gpus": 4, "gpuModels": ["A100"], "cpus": 1, "memory": "1Gi"},
            "entrypoint": {"command": [sys.executable, "-c", URGENT]},
            "data": [{"dataset": "churn", "version": version, "view": "deidentified"}],
            "maxRuntime": "5m",
        },
    }
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def training_story(
    scheduler_addr: str,
    governance_addr: str,
    workflows_addr: str,
    data_dir: Path,
    step: Callable[[str], contextlib.AbstractContextManager[None]],
    console: Console,
    *,
    epochs: int = 60,
    canary: Mapping[str, float] | None = None,
) -> TrainingSummary:
    """Run the chapter; raise :class:`~gantry.core.GantryError` on any surprise."""
    from gantry.training.examples.tabular import churn_table

    summary = TrainingSummary()
    hour = dt.timedelta(hours=1)
    steward_token = create_token(data_dir, STEWARD, ["data-steward"], hour)
    dev_token = create_token(data_dir, DEVELOPER, ["ml-developer"], hour)
    rita_token = create_token(data_dir, RESEARCHER, ["ml-developer"], hour)
    console.print(
        "[bold]Training for real, as a release pipeline[/] — the tabular example on 2 workers, "
        "on governed data, preempted and resumed, registered with lineage, evaluated, and "
        "deployed only if good enough"
    )
    with (
        GovernanceClient(governance_addr, steward_token) as steward,
        step(f"data steward registered 'churn' and uploaded {ROWS:,} rows"),
    ):
        steward.create_dataset(
            "churn", columns=churn_columns(), description="CRM churn table (example)"
        )
        up = steward.upload_table("churn", churn_table(ROWS), shard_bytes=128 << 10)
        version = steward.commit("churn", [up.upload_id], "churn snapshot")
        steward.set_view_policy("churn", POLICY)
        summary.version = version.id
    with (
        SchedulerClient(scheduler_addr, dev_token, timeout_s=10, stream_timeout_s=10) as dev,
        SchedulerClient(scheduler_addr, rita_token, timeout_s=10, stream_timeout_s=10) as rita,
    ):
        with (
            WorkflowsClient(workflows_addr, dev_token) as wf,
            step(
                f"{DEVELOPER} started pipeline {PIPELINE}: model → evaluate → release "
                f"(deployed only if accuracy ≥ {MIN_ACCURACY})"
            ),
        ):
            wf.submit(pipeline_yaml(version=version.id, epochs=epochs, canary=canary or {}))
            run = wf.start(PIPELINE).run
            job = dev.get(_step_job(wf, run.id, "model"))
        with step(f"its first step submitted {JOB}: task {TASK}, 2 workers, low priority"):
            pass
        # preempt as soon as it trains: on an idle machine the whole run takes seconds
        seen = _wait(dev, job.id, console, "training to start", lambda j: _step(j) >= 1)
        with step(f"{JOB} trains on 2 workers (step {_step(seen)}, loss {_loss(seen)})"):
            pass
        with step(f"{RESEARCHER} submitted urgent-eval (high priority, 4 GPUs)"):
            urgent = rita.submit(urgent_yaml(version.id)).job
        seen = _wait(dev, job.id, console, f"{JOB} to be preempted", lambda j: j.state != "running")
        with step(f"{JOB} preempted by urgent-eval: it checkpoints and goes back to the queue"):
            if seen.state == "succeeded":
                raise IntegrityError(f"{JOB} finished before urgent-eval could preempt it")
        _wait(dev, urgent.id, console, "urgent-eval to finish", lambda j: j.state == "succeeded")
        seen = _wait(
            dev,
            job.id,
            console,
            f"{JOB} to resume",
            lambda j: j.attempt > 1 and j.progress is not None and j.progress.attempt == j.attempt,
        )
        assert seen.progress is not None
        summary.resumed_at_step = seen.progress.step
        stored = _restored_step(dev, job.id)
        summary.preempted_at_step = stored
        with step(
            f"{JOB} resumed from its checkpoint of step {stored} (attempt {seen.attempt}, "
            f"first step reported {seen.progress.step})"
        ):
            if stored <= 0 or seen.progress.step <= stored:
                raise IntegrityError(
                    f"{JOB} did not resume from a checkpoint: restored step {stored}, first step "
                    f"reported {seen.progress.step}"
                )
        seen = _wait(dev, job.id, console, f"{JOB} to finish", lambda j: j.state == "succeeded")
        summary.job = seen
        summary.attempts = seen.attempt
        with step(f"{JOB} finished; its agent registered model {seen.model or '?'}"):
            if not seen.model:
                raise IntegrityError(f"{JOB} succeeded but no model was registered")
        with dev.logs(job.id) as lines:
            summary.lines = [f"w{line.worker}| {line.text}" for line in lines]
    name, _, number = seen.model.partition(":")
    from gantry.client.model_registry import ModelsClient

    with (
        ModelsClient(governance_addr, dev_token) as models,
        step("the model's lineage read back from the registry"),
    ):
        model = models.get_model(name, int(number.lstrip("v") or 0))
        lineage = [v.version for v in model.trained_on]
        if model.job_id != job.id or version.id not in lineage:
            raise IntegrityError(f"model {seen.model} lacks its lineage: {model}")
        summary.model = model
    console.print(model_table(summary))
    for line in [ln for ln in summary.lines if "resume" in ln or "finished after" in ln][:6]:
        console.print(f"  {escape(line)}", highlight=False)
    with WorkflowsClient(workflows_addr, dev_token) as wf:
        done = wf.wait(run.id, timeout_s=WAIT_S)
        summary.run = done
        evaluated = done.step("evaluate")
        summary.accuracy = evaluated.metrics.get("accuracy", 0.0)
        release = done.step("release")
        summary.deployed = release.state == "succeeded"
        if done.state != "succeeded" or not summary.deployed:
            raise IntegrityError(
                f"pipeline {PIPELINE} run {done.id} {done.state}: {done.reason} "
                f"(release: {release.state}, {release.reason})"
            )
        with step(
            f"evaluate scored {model.name} v{model.version} on held-out customers: accuracy "
            f"{summary.accuracy:.3f}; the gate opened ({release.reason or 'deployed'})"
        ):
            pass
        console.print(run_table(done))
    return summary


def _step_job(wf: WorkflowsClient, run_id: str, step: str) -> str:
    """The job of ``step`` in run ``run_id``, once the pipeline has submitted it."""
    deadline = time.monotonic() + WAIT_S
    while True:
        run = wf.run(run_id)
        found = run.step(step)
        if found.job_id:
            return found.job_id
        if run.done or found.state in ("failed", "skipped"):
            raise IntegrityError(f"pipeline run {run_id} {run.state}: {run.reason}")
        if time.monotonic() > deadline:
            raise Unavailable(f"timed out waiting for the pipeline to submit step {step}")
        time.sleep(0.2)


def run_table(run: RunInfo) -> Table:
    """The pipeline run: each step, its state and what it used and made."""
    table = Table(
        title=f"pipeline {run.pipeline} run {run.id[:13]}…: {run.state}", title_justify="left"
    )
    for col in ("step", "state", "job", "used", "made", "why"):
        table.add_column(col)
    for s in run.steps:
        table.add_row(
            s.name,
            s.state,
            s.job_id[:13],
            escape(", ".join(a.text for a in s.inputs)),
            escape(", ".join(a.text for a in s.produced)),
            escape(s.reason[:60]),
        )
    return table


def model_table(summary: TrainingSummary) -> Table:
    """The registered model and its lineage."""
    model = summary.model
    table = Table(title="registered model and its lineage", title_justify="left")
    table.add_column("field")
    table.add_column("value")
    if model is None:
        return table
    rows: list[tuple[str, Any]] = [
        ("model", f"{model.name} v{model.version}"),
        ("trained by job", f"{summary.job.name if summary.job else ''} ({model.job_id})"),
        ("attempts", f"{summary.attempts} (preempted at step {summary.preempted_at_step})"),
        ("dataset versions", ", ".join(f"{v.dataset}@{v.version[:12]}" for v in model.trained_on)),
        ("code version", getattr(model, "code_version", "") or "?"),
        ("metrics", ", ".join(f"{k}={v:.4g}" for k, v in sorted(model.metrics.items()))),
        ("registered by", model.registered_by),
    ]
    for key, value in rows:
        table.add_row(key, escape(str(value)))
    return table


def _step(job: JobInfo) -> int:
    return job.progress.step if job.progress is not None else 0


def _loss(job: JobInfo) -> str:
    loss = job.progress.loss if job.progress is not None else None
    return f"{loss:.4f}" if loss is not None else "?"


def _restored_step(client: SchedulerClient, job_id: str) -> int:
    """The step the workers' runtime restored, from its "resume" log line (text or JSON)."""
    deadline = time.monotonic() + 30
    while True:
        with client.logs(job_id) as lines:
            for line in lines:
                text = line.text
                if "resume" in text and re.search(r'restored"?\s*[=:]\s*[Tt]rue', text):
                    found = re.search(r'"?\bstep"?\s*[=:]\s*(\d+)', text)
                    if found:
                        return int(found.group(1))
        if time.monotonic() > deadline:  # logs travel apart from progress: give them a moment
            return 0
        time.sleep(0.3)


def _wait(
    client: SchedulerClient,
    job_id: str,
    console: Console,
    what: str,
    until: Callable[[JobInfo], bool],
) -> JobInfo:
    """Poll the job (showing its progress) until ``until`` holds; raise on failure/timeout."""
    deadline = time.monotonic() + WAIT_S
    progress = Progress(
        TextColumn("  {task.description:<14}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TextColumn("steps  {task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(what[:14], total=None, state="")
        while True:
            job = client.get(job_id)
            p = job.progress
            progress.update(
                task,
                completed=p.step if p else 0,
                total=(p.total_steps or None) if p else None,
                state=f"{job.state} (attempt {job.attempt})",
            )
            if job.terminal and job.state != "succeeded":
                raise IntegrityError(f"job {job.name} ({job.id}) {job.state}: {job.reason}")
            if until(job):
                return job
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"timed out after {WAIT_S:.0f}s waiting for {what}: {job.state} ({job.reason})",
                    hint="run the demo with --verbose to see the services' and agents' logs",
                )
            time.sleep(0.3)


__all__ = [
    "TrainingSummary",
    "job_yaml",
    "model_table",
    "pipeline_yaml",
    "run_table",
    "training_story",
]
