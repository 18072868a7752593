"""Prometheus metrics (adapter): every analysis as series, read from the live state at scrape.

Counters of what came in are kept as they happen; gauges (per-rank phases, straggler ratios,
standing findings, node health and utilisation, cluster allocation against use) are computed
from the :class:`~gantry.profiler.recording.Recorder` at each scrape by a custom collector, so
they never go stale when a job ends. ``deploy/grafana/gantry-profiler.json`` charts them. Jobs
are labelled ``job_id`` (Prometheus keeps ``job`` for the scrape target).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gantry.profiler.recording import Recorder
from gantry.profiler.views import nodes_view
from gantry.profiler.windows import PHASES


class IntakeCounters:
    """Counters of the metric intake, in their own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.windows = Counter(
            "gantry_profiler_windows", "Step windows analysed", registry=registry
        )
        self.merged = Counter(
            "gantry_profiler_windows_merged",
            "Step windows merged into the next by the rate limit",
            registry=registry,
        )
        self.rejected = Counter(
            "gantry_profiler_metrics_rejected",
            "Metric events refused, by reason",
            ["reason"],
            registry=registry,
        )
        self.heartbeats = Counter(
            "gantry_profiler_heartbeats", "Node heartbeats taken", registry=registry
        )
        self.findings = Counter(
            "gantry_profiler_findings",
            "Findings raised or cleared",
            ["kind", "state"],
            registry=registry,
        )
        self.health = Counter(
            "gantry_profiler_node_health_changes",
            "Nodes marked degraded or recovered",
            ["state"],
            registry=registry,
        )


class ProfilerCollector(Collector):
    """Gauges computed from the live state at each scrape."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def collect(self) -> Iterator[Metric]:
        phase = GaugeMetricFamily(
            "gantry_profiler_rank_phase_ms",
            "Per-step milliseconds of each phase of each rank, over the recent steps",
            labels=["job_id", "attempt", "rank", "node", "phase"],
        )
        ratio = GaugeMetricFamily(
            "gantry_profiler_rank_busy_ratio",
            "A rank's busy time over the median of the other ranks' (stragglers > 1.5)",
            labels=["job_id", "attempt", "rank", "node"],
        )
        samples = GaugeMetricFamily(
            "gantry_profiler_job_samples_per_second",
            "Samples per second of all ranks, recent",
            labels=["job_id", "attempt"],
        )
        compute = GaugeMetricFamily(
            "gantry_profiler_job_compute_fraction",
            "Forward and backward over the step time (median rank)",
            labels=["job_id", "attempt"],
        )
        standing = GaugeMetricFamily(
            "gantry_profiler_finding_active",
            "1 for each standing finding",
            labels=["job_id", "attempt", "kind", "rank", "node", "phase", "cause"],
        )
        with self.recorder.lock:
            for record in self.recorder.profiles.jobs.values():
                if not record.running:
                    continue
                job, attempt = record.job_id, str(record.attempt)
                summary = record.gang.rank_summary()
                rate = 0.0
                fractions = []
                for rank, s in summary.items():
                    node = record.gang.ranks[rank].node
                    for p in PHASES:
                        phase.add_metric([job, attempt, str(rank), node, p], s[f"{p}_ms"])
                    others = [v["busy_ms"] for r, v in summary.items() if r != rank]
                    if others:  # the verdict's own measure: over the others' median
                        median = statistics.median(others)
                        ratio.add_metric(
                            [job, attempt, str(rank), node], s["busy_ms"] / max(median, 1e-6)
                        )
                    if s["step_ms"] > 0:
                        rate += s["samples_per_step"] / s["step_ms"] * 1000
                        fractions.append((s["forward_ms"] + s["backward_ms"]) / s["step_ms"])
                if summary:
                    samples.add_metric([job, attempt], rate)
                    fractions.sort()
                    compute.add_metric([job, attempt], fractions[len(fractions) // 2])
                for f in record.gang.active.values():
                    standing.add_metric(
                        [
                            job,
                            attempt,
                            f.kind,
                            "" if f.rank is None else str(f.rank),
                            f.node,
                            f.phase,
                            f.cause,
                        ],
                        1,
                    )
        yield from (phase, ratio, samples, compute, standing)
        nodes, cluster = nodes_view(self.recorder)
        per_node = {
            "degraded": ("gantry_profiler_node_degraded", "1 when the node is degraded"),
            "cpu_util": ("gantry_profiler_node_cpu_utilisation", "CPU busy fraction, recent"),
            "gpu_util": ("gantry_profiler_node_gpu_utilisation", "GPU busy fraction, recent"),
            "gpus": ("gantry_profiler_node_gpus", "GPUs of the node"),
            "gpus_allocated": ("gantry_profiler_node_gpus_allocated", "GPUs placed on"),
            "cpus": ("gantry_profiler_node_cpus", "CPUs of the node"),
            "cpus_allocated": ("gantry_profiler_node_cpus_allocated", "CPUs placed on"),
            "temperature_c": ("gantry_profiler_node_gpu_temperature_celsius", "Hottest GPU"),
            "power_w": ("gantry_profiler_node_gpu_power_watts", "Power of all GPUs"),
            "throttled": ("gantry_profiler_node_throttled", "1 when a GPU is throttling"),
            "net_rx_bytes_per_s": ("gantry_profiler_node_network_receive_bytes", "Bytes/s in"),
            "net_tx_bytes_per_s": ("gantry_profiler_node_network_transmit_bytes", "Bytes/s out"),
        }
        for attr, (name, doc) in per_node.items():
            family = GaugeMetricFamily(name, doc, labels=["node"])
            for n in nodes:
                value = (n.state == "degraded") if attr == "degraded" else getattr(n, attr)
                family.add_metric([n.node], float(value))
            yield family
        gpus = GaugeMetricFamily(
            "gantry_profiler_cluster_gpus", "Cluster GPUs by state", labels=["state"]
        )
        cpus = GaugeMetricFamily(
            "gantry_profiler_cluster_cpus", "Cluster CPUs by state", labels=["state"]
        )
        for state, g, c in (
            ("total", cluster.gpus, cluster.cpus),
            ("allocated", cluster.gpus_allocated, cluster.cpus_allocated),
            ("busy", cluster.gpus_busy, cluster.cpus_busy),
        ):
            gpus.add_metric([state], float(g))
            cpus.add_metric([state], float(c))
        yield gpus
        yield cpus
        jobs = GaugeMetricFamily("gantry_profiler_running_jobs", "Attempts being profiled")
        jobs.add_metric([], float(cluster.running_jobs))
        yield jobs


def registry_for(recorder: Recorder) -> tuple[CollectorRegistry, IntakeCounters]:
    """A registry with the profiler's gauges and counters."""
    registry = CollectorRegistry()
    registry.register(ProfilerCollector(recorder))
    return registry, IntakeCounters(registry)


__all__ = ["IntakeCounters", "ProfilerCollector", "registry_for"]
