"""Prometheus metrics (adapter): runs, steps, experiments, trials and dev sessions by state.

Every gauge is counted from the service's database at each scrape by a custom collector (one
``GROUP BY`` per table), so the figures are the durable state's and never go stale across a
restart; counters of what the loop did are kept as it happens.
"""

from __future__ import annotations

from collections.abc import Iterator

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gantry.workflows import store


class LoopCounters:
    """What the control loop did, in the service's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ticks = Histogram(
            "gantry_workflows_tick_seconds",
            "Time of one pass of the control loop (runs, schedules, experiments, sessions)",
            registry=registry,
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self.tick_failures = Counter(
            "gantry_workflows_tick_failures",
            "Passes of the control loop that raised (logged; the next pass runs)",
            registry=registry,
        )


class WorkflowCollector(Collector):
    """Gauges counted from the database at each scrape."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        families = (
            ("gantry_workflows_runs", "Pipeline runs by state", store.runs, "pipeline"),
            ("gantry_workflows_experiments", "Experiments by state", store.experiments, None),
            ("gantry_workflows_trials", "Experiment trials by state", store.trials, None),
            ("gantry_workflows_dev_sessions", "Dev sessions by state", store.sessions, None),
        )
        with self.engine.connect() as conn:
            for name, doc, table, by in families:
                labels = ["state"] if by is None else [by, "state"]
                family = GaugeMetricFamily(name, doc, labels=labels)
                columns = [table.c.state] if by is None else [table.c[by], table.c.state]
                query = sa.select(*columns, sa.func.count()).group_by(*columns)
                for row in conn.execute(query):
                    family.add_metric([str(v) for v in row[:-1]], float(row[-1]))
                yield family
            pipelines = GaugeMetricFamily(
                "gantry_workflows_pipelines", "Pipelines (not deleted) by kind", labels=["kind"]
            )
            query = (
                sa.select(store.pipelines.c.kind, sa.func.count())
                .where(store.pipelines.c.deleted.is_(False))
                .group_by(store.pipelines.c.kind)
            )
            for row in conn.execute(query):
                pipelines.add_metric([str(row[0])], float(row[1]))
            yield pipelines
            missed = GaugeMetricFamily(
                "gantry_workflows_schedule_missed",
                "Cron fires missed (past their starting deadline), per pipeline",
                labels=["pipeline"],
            )
            for name, count in conn.execute(
                sa.select(store.schedules.c.name, store.schedules.c.missed)
            ):
                missed.add_metric([name], float(count))
            yield missed


def registry_for(engine: sa.Engine) -> tuple[CollectorRegistry, LoopCounters]:
    """A registry with the service's gauges and loop counters."""
    registry = CollectorRegistry()
    registry.register(WorkflowCollector(engine))
    return registry, LoopCounters(registry)


__all__ = ["LoopCounters", "WorkflowCollector", "registry_for"]
