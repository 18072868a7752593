"""Benchmark: hyperparameter search (TPE with ASHA pruning against random search) and the time
a pipeline spends outside its steps' own work.

    python bench/workflows.py [--quick]

**Search.** The task: an MLP classifying the churn table of the tabular example (20,000 rows,
4 features, held-out every 5th customer), trained for real on this machine's CPU, one trial at
a time, ``EPOCHS`` epochs each, held-out accuracy reported after every epoch. The space:
learning rate (log-uniform 1e-5..1), hidden width (int 4..128), optimizer (sgd, adam), batch
size (choice 32..1024). Both searches run through the workflows service's own
:class:`~gantry.workflows.experimenter.Experimenter` (its Optuna study, its pruner, its trial
bookkeeping) over an in-process platform that trains each trial's model epoch by epoch:

- ``hpo_best_objective``: TPE with ASHA (successive halving) pruning, first rung after 2
  epochs (one epoch's accuracy is too noisy to judge by), reduction factor 3, ``TRIALS`` trials;
- ``random_search_best_objective``: random sampling without pruning, the same ``TRIALS``
  trials on the same task (target: HPO at least as good);
- ``hpo_gpu_seconds_ratio``: device-seconds (here: CPU seconds of training and evaluation)
  the HPO search used over random search's (target <= 0.6); ``hpo_pruned`` trials stopped
  early. Repeated over 5 seeds (1 with ``--quick``); the figures are medians over seeds.

**Pipeline overhead (the embedded platform: NATS, every service, one node agent).** A 4-step
pipeline (a → b → c → d, each a job sleeping ``STEP_S``) runs start to end;
``pipeline_overhead_s`` is its wall time minus the sum of its jobs' own run times (scheduling,
placement, process start, events, the workflows loop), ``pipeline_wall_s`` the whole.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import torch
from _common import emit_result
from torch import nn

from gantry.core import ManualClock
from gantry.workflows import store
from gantry.workflows.experimenter import Experimenter
from gantry.workflows.pipelines import Deploy
from gantry.workflows.platform import JobStatus, Owner, Rollout

OWNER = Owner("bench", ("ml-developer",))
EXPERIMENT = """\
apiVersion: gantry/v1
kind: Experiment
metadata: {{name: {name}}}
spec:
  objective: {{metric: accuracy, goal: maximize}}
  method: {method}
  seed: {seed}
  pruner: {{kind: {pruner}, minEpochs: 2, reductionFactor: 3}}
  budget: {{trials: {trials}}}
  parallelism: 1
  space:
    lr: {{logUniform: [0.00001, 1.0]}}
    hidden: {{int: [4, 128]}}
    optimizer: {{choice: [sgd, adam]}}
    batch: {{choice: [32, 128, 512, 1024]}}
  trial:
    entrypoint:
      task: bench:task
      args:
        - lr=${{trial.lr}}
        - hidden=${{trial.hidden}}
        - optimizer=${{trial.optimizer}}
        - batch=${{trial.batch}}
"""


def churn_arrays() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train and held-out features/labels of the tabular example's churn table."""
    from gantry.training.examples.tabular import FEATURES, HOLDOUT_EVERY, LABEL, churn_table

    table = churn_table(20_000)
    x = np.stack([table.column(f).to_numpy(zero_copy_only=False) for f in FEATURES], 1)
    x = np.nan_to_num(x.astype("float32"))
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = table.column(LABEL).to_numpy(zero_copy_only=False).astype("int64")
    held = table.column("customer_id").to_numpy(zero_copy_only=False) % HOLDOUT_EVERY == 0
    t = torch.from_numpy
    return t(x[~held]), t(y[~held]), t(x[held]), t(y[held])


class Trainer:
    """One trial's model, trained an epoch at a time."""

    def __init__(self, values: Mapping[str, Any], data: Any, seed: int) -> None:
        torch.manual_seed(seed)
        self.x, self.y, self.xv, self.yv = data
        hidden = int(values["hidden"])
        self.model = nn.Sequential(
            nn.Linear(self.x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 2)
        )
        lr = float(values["lr"])
        params = self.model.parameters()
        self.opt: torch.optim.Optimizer = (
            torch.optim.Adam(params, lr=lr)
            if values["optimizer"] == "adam"
            else torch.optim.SGD(params, lr=lr, momentum=0.9)
        )
        self.batch = int(values["batch"])
        self.gen = torch.Generator().manual_seed(seed)
        self.seconds = 0.0

    def epoch(self) -> float:
        started = time.process_time()
        order = torch.randperm(len(self.x), generator=self.gen)
        loss_fn = nn.CrossEntropyLoss()
        self.model.train()
        for i in range(0, len(order), self.batch):
            idx = order[i : i + self.batch]
            self.opt.zero_grad()
            loss = loss_fn(self.model(self.x[idx]), self.y[idx])
            if not torch.isfinite(loss):
                break
            loss.backward()
            self.opt.step()
        self.model.eval()
        with torch.no_grad():
            accuracy = float((self.model(self.xv).argmax(1) == self.yv).float().mean())
        self.seconds += time.process_time() - started
        return accuracy if math.isfinite(accuracy) else 0.0


class TrainingPlatform:
    """The experimenter's platform: each trial job is a :class:`Trainer` run in this process."""

    def __init__(self, data: Any, seed: int) -> None:
        self.data = data
        self.seed = seed
        self.jobs: dict[str, dict[str, Any]] = {}

    def submit_job(self, document: Mapping[str, Any], *, request_id: str, owner: Owner) -> str:
        for job_id, job in self.jobs.items():
            if job["request"] == request_id:
                return job_id
        args = dict(a.split("=", 1) for a in document["spec"]["entrypoint"]["args"])
        job_id = f"job-{len(self.jobs)}"
        self.jobs[job_id] = {
            "request": request_id,
            "trainer": Trainer(args, self.data, self.seed + len(self.jobs)),
            "state": "running",
            "epochs": 0,
            "metrics": {},
        }
        return job_id

    def job(self, job_id: str, *, owner: Owner) -> JobStatus:
        job = self.jobs[job_id]
        return JobStatus(
            job_id,
            job["state"],
            metrics=job["metrics"],
            model=f"bench:{job_id}" if job["state"] == "succeeded" else "",
            device_seconds=job["trainer"].seconds,
        )

    def cancel_job(self, job_id: str, reason: str, *, owner: Owner) -> None:
        self.jobs[job_id]["state"] = "cancelled"

    def deploy(self, spec: Deploy, model: str, version: int, *, owner: Owner) -> Rollout:
        raise NotImplementedError("no deploys in this benchmark")

    def rollout(self, deployment: str, version: int, *, owner: Owner) -> Rollout | None:
        return None

    def answers(self, endpoint: str) -> bool:
        return True


def search(
    method: str, pruner: str, trials: int, epochs: int, seed: int, data: Any
) -> dict[str, Any]:
    """One search; its best objective, device-seconds and pruned trials."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = store.connect(f"sqlite:///{tmp}/wf.db")
        store.migrate(engine)
        platform = TrainingPlatform(data, seed)
        experimenter = Experimenter(engine, platform, f"sqlite:///{tmp}/studies.db", ManualClock())
        name = f"{method}-{pruner}"
        experimenter.submit(
            EXPERIMENT.format(name=name, method=method, pruner=pruner, trials=trials, seed=seed),
            owner=OWNER,
        )
        while not experimenter.get(name).done:
            for t in experimenter.get(name).trials:
                job = platform.jobs.get(t.job_id)
                if t.state != "running" or job is None or job["state"] != "running":
                    continue
                job["epochs"] += 1
                accuracy = job["trainer"].epoch()
                experimenter.evaluation(t.job_id, job["epochs"], {"accuracy": accuracy})
                if job["state"] == "running" and job["epochs"] >= epochs:
                    job["state"] = "succeeded"
                    job["metrics"] = {"accuracy": accuracy}
            experimenter.tick()
        done = experimenter.get(name)
        engine.dispose()
        best = done.best
        return {
            "best": best.value if best is not None and best.value is not None else 0.0,
            "device_s": done.device_s,
            "pruned": sum(1 for t in done.trials if t.state == "pruned"),
            "trials": len(done.trials),
        }


def pipeline_overhead(step_s: float) -> dict[str, float]:
    """Run the 4-step chain on the embedded platform; wall time and time outside the jobs."""
    import datetime as dt

    import yaml

    from gantry.client.admin import create_token
    from gantry.client.scheduler import SchedulerClient
    from gantry.client.workflows import WorkflowsClient
    from gantry.supervisor.platform import Platform, local_agents

    command = [sys.executable, "-c", f"import time; time.sleep({step_s})"]
    steps: list[dict[str, Any]] = []
    for i, name in enumerate("abcd"):
        step: dict[str, Any] = {
            "name": name,
            "train": {
                "resources": {"cpus": 0.5, "memory": "256Mi"},
                "entrypoint": {"command": command},
            },
        }
        if i:
            step["dependsOn"] = ["abcd"[i - 1]]
        steps.append(step)
    source = yaml.safe_dump(
        {
            "apiVersion": "gantry/v1",
            "kind": "Pipeline",
            "metadata": {"name": "overhead"},
            "spec": {"steps": steps},
        },
        sort_keys=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        platform = Platform(
            data, nats_port=0, agents=local_agents(1, gpus=0), log_sink=lambda line: None
        )
        with platform:
            token = create_token(data, "bench", ["ml-developer"], dt.timedelta(hours=1))
            with WorkflowsClient(platform.address("workflows"), token) as wf:
                wf.submit(source)
                started = time.monotonic()
                run = wf.start("overhead").run
                run = wf.wait(run.id, timeout_s=300, poll_s=0.05)
                wall = time.monotonic() - started
            if not run.succeeded:
                raise SystemExit(f"the pipeline run {run.state}: {run.reason}")
            own = 0.0
            with SchedulerClient(platform.address("scheduler"), token) as sched:
                for step in run.steps:
                    job = sched.get(step.job_id)
                    own += (job.finished_ms - job.started_ms) / 1000
    return {"pipeline_wall_s": wall, "pipeline_overhead_s": wall - own, "pipeline_jobs_s": own}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    args = parser.parse_args()
    trials, epochs, seeds, step_s = (12, 6, 1, 0.2) if args.quick else (30, 10, 5, 1.0)
    torch.set_num_threads(1)
    data = churn_arrays()
    hpo, rnd = [], []
    for seed in range(seeds):
        hpo.append(search("tpe", "asha", trials, epochs, seed, data))
        rnd.append(search("random", "none", trials, epochs, seed, data))
        print(f"seed {seed}: tpe+asha {hpo[-1]}, random {rnd[-1]}", flush=True)
    figures: dict[str, Any] = {
        "hpo_best_objective": statistics.median(r["best"] for r in hpo),
        "random_search_best_objective": statistics.median(r["best"] for r in rnd),
        "hpo_gpu_seconds_ratio": statistics.median(
            h["device_s"] / r["device_s"] for h, r in zip(hpo, rnd, strict=True)
        ),
        "hpo_pruned": statistics.median(r["pruned"] for r in hpo),
        "trials": trials,
        "epochs": epochs,
        "seeds": seeds,
    }
    figures.update(pipeline_overhead(step_s))
    figures["quick"] = args.quick
    emit_result("workflows", figures)


if __name__ == "__main__":
    main()
