"""The Grafana dashboard charts only series the profiler exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import sqlalchemy as sa
from prometheus_client import generate_latest

from gantry.events.catalog import GpuUsage, JobScheduled, NodeHeartbeat, NodeRegistered
from gantry.profiler import store
from gantry.profiler.metrics import registry_for
from gantry.profiler.profiles import Profiles
from gantry.profiler.recording import Recorder

from .test_analyses import w

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "gantry-profiler.json"


def test_every_series_on_the_dashboard_is_exported(tmp_path: Path) -> None:
    engine = store.connect(f"sqlite:///{tmp_path / 'p.db'}")
    store.migrate(engine)
    recorder = Recorder(engine, Profiles(min_interval_s=0))
    registry, counters = registry_for(recorder)
    recorder.scheduled(JobScheduled(job_id="j", nodes=["n0", "n1"]))
    recorder.registered(NodeRegistered(node="n0", cpu_milli=8000, memory_mib=1024))
    recorder.heartbeats([(NodeHeartbeat(node="n0", seq=1, gpus=[GpuUsage(index=0)]), 1)])
    applied = recorder.windows(
        [
            x
            for first in range(1, 61, 10)
            for x in (w(0, first, first + 9, comm=20.5), w(1, first, first + 9, data=21.0))
        ]
    )
    assert [f.kind for _, _, f in applied.findings] == ["straggler"]
    counters.windows.inc(applied.windows)
    counters.merged.inc(0)
    counters.rejected.labels("duplicate").inc()
    counters.findings.labels("straggler", "raised").inc()
    counters.health.labels("degraded").inc()
    exported = generate_latest(registry).decode()
    names = set(re.findall(r"^(gantry_\w+?)(?:\{| )", exported, re.MULTILINE))
    board = json.loads(DASHBOARD.read_text())
    used = set()
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used |= set(re.findall(r"gantry_profiler_\w+", target["expr"]))
    assert used, "the dashboard charts something"
    missing = sorted(used - names)
    assert missing == [], f"charted but not exported: {missing}"
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(store.windows)).scalar() == 12
