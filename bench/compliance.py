"""Benchmark: compliance — the anomaly detector on simulated months, data-subject queries and
report generation.

    python bench/compliance.py [--quick]

**Method.** For each seed, :func:`gantry.testing.access_month.simulate_month` builds a month of
audit events of a small ML platform (``DAYS`` days, deterministic from the seed alone) twice:
once with known anomalies injected into its last ten days (``inject=True``; each listed with
the exact ids of the events that make it up) and once without (``inject=False``; the same
month less the injected events). A fresh :class:`~gantry.audit.behaviour.BehaviourModel` with
the default :class:`~gantry.audit.behaviour.AnomalySettings` judges each month's events in time
order (``observe_all``), learning as it goes, as the audit service does. An injected behaviour
is *caught* when an anomaly of the same kind and principal shares an event id with it; an
anomaly that shares no event id with any injection is a *false alarm*. 10 seeds (0..9), 3
(0..2) with ``--quick``; every count is pooled over seeds before it is divided.

Figures (of the injected months unless said otherwise):

- ``anomaly_recall``: injections caught / injections (target >= 0.95);
- ``anomaly_false_alarms_per_day``: false alarms / days simulated (target <= 1);
- ``anomaly_recall_by_kind``: the recall of each injected kind;
- ``anomaly_false_alarms_by_kind``: the number of false alarms of each detected kind;
- ``anomaly_false_alarms_per_day_normal``: every alarm raised on the normal months (nothing
  injected, so every alarm is false) / days simulated — what the default sensitivity costs
  on an ordinary month;
- ``anomaly_events``: the events judged (all the injected months' events);
- ``anomaly_events_per_s``: detector throughput, ``anomaly_events`` / the seconds spent in
  ``observe_all`` on those months (``time.perf_counter``; building the months is not timed);
- ``subject_query_ms`` (target <= 500), ``report_generation_s`` and their companions: the
  data-subject report and a month's compliance report on the real audit and governance
  services over a seeded log of 1,000,000 events (200,000 with ``--quick``) and 100 dataset
  versions — the method is in ``bench/_subject_query.py``;
- ``seeds``, ``days``, ``quick``: the run's shape.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit_result
from _subject_query import measure as measure_subject_query

from gantry.audit.behaviour import KINDS, Anomaly, AnomalySettings, BehaviourModel
from gantry.testing.access_month import INJECTED_KINDS, Injected, simulate_month

DAYS = 30


def judge(events: Sequence[Any]) -> tuple[list[Anomaly], float]:
    """The anomalies a fresh default detector finds in ``events``, and the seconds it took."""
    model = BehaviourModel(AnomalySettings())
    started = time.perf_counter()
    found = model.observe_all(events)
    return found, time.perf_counter() - started


def score(
    injected: Sequence[Injected], found: Sequence[Anomaly]
) -> tuple[list[bool], list[Anomaly]]:
    """Whether each injection was caught, and the anomalies that are false alarms."""
    caught = [
        any(
            a.kind == inj.kind
            and a.principal == inj.principal
            and set(a.event_ids) & set(inj.event_ids)
            for a in found
        )
        for inj in injected
    ]
    injected_ids = {i for inj in injected for i in inj.event_ids}
    false = [a for a in found if not set(a.event_ids) & injected_ids]
    return caught, false


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    args = parser.parse_args()
    seeds = 3 if args.quick else 10

    injected_by_kind = dict.fromkeys(INJECTED_KINDS, 0)
    caught_by_kind = dict.fromkeys(INJECTED_KINDS, 0)
    false_by_kind = dict.fromkeys(KINDS, 0)
    events = 0
    judging_s = 0.0
    days = 0
    normal_alarms = 0
    normal_days = 0
    for seed in range(seeds):
        month = simulate_month(seed, DAYS, inject=True)
        found, seconds = judge(month.events)
        caught, false = score(month.injected, found)
        for inj, hit in zip(month.injected, caught, strict=True):
            injected_by_kind[inj.kind] = injected_by_kind.get(inj.kind, 0) + 1
            caught_by_kind[inj.kind] = caught_by_kind.get(inj.kind, 0) + hit
        for a in false:
            false_by_kind[a.kind] = false_by_kind.get(a.kind, 0) + 1
        events += len(month.events)
        judging_s += seconds
        days += month.days

        normal = simulate_month(seed, DAYS, inject=False)
        normal_found, _ = judge(normal.events)
        normal_alarms += len(normal_found)
        normal_days += normal.days
        missed = [
            f"{i.kind}:{i.principal}"
            for i, hit in zip(month.injected, caught, strict=True)
            if not hit
        ]
        note = f" (missed {', '.join(missed)})" if missed else ""
        print(
            f"seed {seed}: {len(month.events)} events, caught {sum(caught)}/{len(caught)}{note},"
            f" {len(false)} false alarms, {len(normal_found)} alarms on the normal month,"
            f" {len(month.events) / seconds:,.0f} events/s",
            flush=True,
        )

    shape = (
        {"events": 200_000, "rows": 20_000, "versions": 100, "repeats": 5}
        if args.quick
        else {"events": 1_000_000, "rows": 100_000, "versions": 100, "repeats": 9}
    )
    print(f"data-subject query and report generation: {shape}", flush=True)
    subject = measure_subject_query(**shape)
    print(
        f"subject query {subject['subject_query_ms']:.0f} ms over "
        f"{subject['subject_audit_events']:,} audit events and "
        f"{subject['subject_dataset_versions']} versions; report "
        f"{subject['report_generation_s']:.1f} s over {subject['report_events']:,} events",
        flush=True,
    )

    injections = sum(injected_by_kind.values())
    figures: dict[str, Any] = {
        "anomaly_recall": sum(caught_by_kind.values()) / injections,
        "anomaly_false_alarms_per_day": sum(false_by_kind.values()) / days,
        "anomaly_recall_by_kind": {
            kind: caught_by_kind[kind] / n for kind, n in injected_by_kind.items() if n
        },
        "anomaly_false_alarms_by_kind": false_by_kind,
        "anomaly_false_alarms_per_day_normal": normal_alarms / normal_days,
        "anomaly_events": events,
        "anomaly_events_per_s": events / judging_s,
        **subject,
        "seeds": seeds,
        "days": DAYS,
        "quick": args.quick,
    }
    emit_result("compliance", figures)


if __name__ == "__main__":
    main()
