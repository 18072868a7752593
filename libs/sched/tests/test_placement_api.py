"""Pins gantry.sched's public names: changing them is a deliberate act."""

from __future__ import annotations

import gantry.sched

PUBLIC = [
    "BestFitPolicy", "Cluster", "Demand", "FgdPolicy", "GPU_MILLI", "GantryPolicy",
    "InflationResult", "Placement", "PlacementPolicy", "RandomPolicy", "Workload",
    "feasible_nodes", "fragmentation", "inflate", "load_nodes_csv", "load_pods_csv",
    "model_pressure", "run_arrivals", "stranded",
    "Admission", "Amount", "DataSensitivity", "DurationPredictor", "JobFeatures", "ORDERINGS",
    "Pool", "QueueBook", "QueueConfig", "SimResult", "Simulator", "TraceJob", "TrainingJob",
    "eligible_pools", "jobs_from_alibaba", "load_jobs_csv", "load_queues", "parse_job",
    "parse_jobs_csv", "simulate",
]  # fmt: skip


def test_public_names_are_pinned() -> None:
    assert sorted(gantry.sched.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert hasattr(gantry.sched, name), name
