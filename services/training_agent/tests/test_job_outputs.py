"""What jobs take in and leave, through the agent with a real governance service on the same
nats-server: an evaluation's model downloaded for the job (GANTRY_MODEL_DIR) and evaluated by
the runtime, its metrics in the success report; a data job's transform table committed as a
dataset version for the job's owner, or refused for an owner who may not update it."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from gantry.client.governance import GovernanceClient
from gantry.client.specs import parse_schema
from gantry.core import NatsSettings
from gantry.events.catalog import DatasetUse, JobScheduled
from gantry.governance.app import GovernanceService
from gantry.governance.settings import GovernanceOptions, GovernanceSettings
from gantry.security import TokenIssuer
from gantry.storage import StorageSettings
from gantry.training.examples import tabular
from gantry.training.export import export_model
from gantry.training_agent.agent import CANNOT_START, NodeAgent

from .conftest import Env

pytestmark = pytest.mark.timeout(180)

#: Scores a 4 -> 2 classifier on fixed data: the accuracy the test computes too.
EVAL_TASK = """
import torch
from gantry.training import Task

def data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4, generator=g)
    return x, (x[:, 0] > 0).long()

def evaluate(model, ctx):
    x, y = data()
    with torch.no_grad():
        predicted = model(x).argmax(dim=1)
    return {"accuracy": float((predicted == y).float().mean()), "rows": 64}

task = Task(
    model=lambda: torch.nn.Linear(4, 2),
    loss=torch.nn.functional.cross_entropy,
    dataset=lambda ctx: torch.utils.data.TensorDataset(*data()),
    evaluate=evaluate,
)
"""


@dataclass
class Governance:
    """The running service and clients with users' tokens (blocking clients: call them in a
    thread, since the service answers in the test's event loop)."""

    address: str
    issuer: TokenIssuer

    def client(self, user: str, role: str) -> GovernanceClient:
        token = self.issuer.issue(user, [role], dt.timedelta(minutes=10))
        return GovernanceClient(self.address, token)


@pytest.fixture
async def gov(env: Env) -> AsyncIterator[Governance]:
    """Governance in the agent's data directory: the agent finds it by its run file, and both
    trust the keys there (the scheduler's too)."""
    settings = GovernanceSettings(
        data_dir=env.data_dir,
        nats=NatsSettings(url=env.nats_url, reconnect_wait_s=0.1),
        governance=GovernanceOptions(grpc_port=0, metrics_port=0, shard_bytes=64 << 10),
        storage=StorageSettings(chunk_size=64 << 10),
    )
    issuer = TokenIssuer(env.keyring.issuer(create=True))
    service = GovernanceService(settings)
    task = asyncio.create_task(service.run())
    async with asyncio.timeout(20):
        while service.grpc_port == 0 or not (env.data_dir / "run" / "governance.json").exists():
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
    try:
        yield Governance(f"127.0.0.1:{service.grpc_port}", issuer)
    finally:
        service.stop()
        await asyncio.wait_for(task, 30)


def placed(env: Env, spec: dict[str, Any], owner: tuple[str, str], **kw: Any) -> JobScheduled:
    """One worker here, for ``owner``, running ``spec``."""
    job = env.scheduler.job("")
    return job.model_copy(
        update={"spec": spec, "owner": owner[0], "owner_roles": [owner[1]], "name": "j", **kw}
    )


# -- evaluation ----------------------------------------------------------------------------------


@pytest.fixture
async def scorer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gov: Governance) -> float:
    """Model ``scorer`` v1 registered by a developer, the task that evaluates it importable
    by the workers; the accuracy the evaluation must report."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "evaltask.py").write_text(EVAL_TASK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    artifact, fmt, signature = export_model(model, torch.randn(2, 4), tmp_path / "export")

    def register() -> None:  # in a thread: the service answers in this event loop
        with gov.client("dev", "ml-developer") as client:
            client.register_model(
                "scorer", tmp_path / "export" / artifact, framework="pytorch",
                signature={**signature, "format": fmt}, metrics={"accuracy": 0.5},
            )  # fmt: skip

    await asyncio.to_thread(register)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 4, generator=g)
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == (x[:, 0] > 0).long()).float().mean())


EVALUATE = {
    "entrypoint": {"task": "evaltask:task", "mode": "evaluate"},
    "model": {"name": "scorer", "version": 1},
}


async def test_an_evaluation_downloads_its_model_and_reports_the_metrics(
    env: Env, gov: Governance, agent: NodeAgent, scorer: float
) -> None:
    job = placed(env, EVALUATE, ("dev", "ml-developer"))
    await env.scheduler.schedule(job)
    done = await env.watch.report(job.job_id, "succeeded", wait_s=90)

    assert done["metrics"] == {"accuracy": pytest.approx(scorer), "rows": 64.0}
    assert done["model"] == "" and done["dataset_version"] == ""  # it registered nothing
    model_dir = env.checkpoint_dir(job) / "model"
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.json", "model.pt2"]
    notes = env.watch.log_lines(job.job_id, "gantry")
    assert any(f"downloaded model scorer:1 into {model_dir}" in n for n in notes)
    assert any("evaluated scorer: accuracy=" in line for line in env.watch.log_lines(job.job_id))

    def versions() -> list[int]:
        with gov.client("dev", "ml-developer") as client:
            return [m.version for m in client.list_models("scorer")]

    assert await asyncio.to_thread(versions) == [1]


async def test_a_download_governance_refuses_fails_the_job_with_its_reason(
    env: Env, gov: Governance, agent: NodeAgent, scorer: float
) -> None:
    job = placed(env, EVALUATE, ("ann", "annotator"))  # annotators may not read models
    await env.scheduler.schedule(job)
    failed = await env.watch.report(job.job_id, "failed", wait_s=60)

    assert failed["exit_code"] == CANNOT_START
    message = failed["message"]
    assert "the input model scorer:1 could not be downloaded" in message
    assert f"it acts for job {job.job_id}, whose owner is refused" in message
    missing = placed(env, {**EVALUATE, "model": {"name": "scorer", "version": 7}},
                     ("dev", "ml-developer"))  # fmt: skip
    await env.scheduler.schedule(missing)
    failed = await env.watch.report(missing.job_id, "failed", wait_s=60)
    assert "the input model scorer:7 could not be downloaded" in failed["message"]
    assert "scorer version 7" in failed["message"]


# -- data jobs -----------------------------------------------------------------------------------


@pytest.fixture
async def churn(gov: Governance) -> str:
    """``churn`` with 400 rows and an empty ``churn-features``, created by a data steward;
    the churn version id."""

    def create() -> str:
        with gov.client("sam", "data-steward") as client:
            for name, schema in (
                (tabular.DATASET, tabular.SCHEMA_YAML),
                (tabular.FEATURES_DATASET, tabular.FEATURES_SCHEMA_YAML),
            ):
                client.create_dataset(name, columns=parse_schema(yaml.safe_load(schema)))
            up = client.upload_table(tabular.DATASET, tabular.churn_table(rows=400, seed=2))
            return client.commit(tabular.DATASET, [up.upload_id], "example churn").id

    return await asyncio.to_thread(create)


def features_job(env: Env, version: str, owner: tuple[str, str]) -> JobScheduled:
    use = {"dataset": tabular.DATASET, "version": version, "view": "deidentified"}
    spec = {
        "entrypoint": {"transform": "gantry.training.examples.tabular:features"},
        "data": [use],
        "output": {"dataset": tabular.FEATURES_DATASET, "message": "cleaned"},
    }
    return placed(env, spec, owner, datasets=[DatasetUse(**use)])


async def test_a_data_job_commits_its_table_as_the_owner_with_lineage(
    env: Env, gov: Governance, agent: NodeAgent, churn: str
) -> None:
    job = features_job(env, churn, ("sam", "data-steward"))
    await env.scheduler.schedule(job)
    done = await env.watch.report(job.job_id, "succeeded", wait_s=90)

    dataset, _, version = done["dataset_version"].partition("@")
    assert dataset == tabular.FEATURES_DATASET and len(version) == 64
    assert done["metrics"] == {"rows": 400.0}  # the generated table has no bad rows

    def check() -> tuple[Any, pa.Table, Any]:
        with gov.client("sam", "data-steward") as client:
            head = client.get_version(tabular.FEATURES_DATASET)
            table = client.read(tabular.FEATURES_DATASET, view="raw")
            edges = client.lineage(dataset=tabular.FEATURES_DATASET, version=version)
        return head, table, edges

    head, table, edges = await asyncio.to_thread(check)
    assert head.id == version and head.author == "sam"
    assert head.message == f"cleaned (job {job.job_id})"
    assert tuple(table.column_names) == tabular.KEPT and table.num_rows == 400
    assert {(e.from_id, e.to_id) for e in edges} >= {
        (f"{tabular.DATASET}@{churn}", job.job_id),
        (job.job_id, f"{tabular.FEATURES_DATASET}@{version}"),
    }
    notes = env.watch.log_lines(job.job_id, "gantry")
    assert any(f"committed {done['dataset_version']}" in n for n in notes)


async def test_a_data_job_whose_owner_may_not_update_the_dataset_fails_and_keeps_its_files(
    env: Env, gov: Governance, agent: NodeAgent, churn: str
) -> None:
    job = features_job(env, churn, ("dev", "ml-developer"))  # may read, may not update
    await env.scheduler.schedule(job)
    failed = await env.watch.report(job.job_id, "failed", wait_s=90)

    kept = env.checkpoint_dir(job) / "output-1" / "dataset"
    message = failed["message"]
    assert "its output could not be committed to churn-features" in message
    assert f"it acts for job {job.job_id}, whose owner is refused" in message
    assert f"the files are kept in {kept}" in message
    assert pq.read_table(kept / "part-00000.parquet").num_rows == 400
    assert any("could not be committed" in n for n in env.watch.log_lines(job.job_id, "gantry"))

    def versions() -> int:
        with gov.client("sam", "data-steward") as client:
            return len(client.log(tabular.FEATURES_DATASET))

    assert await asyncio.to_thread(versions) == 0
