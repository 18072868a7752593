"""Benchmark: how long the web console's pages take to load in a real browser.

    python bench/console.py [--quick] [--screenshots DIR]

The platform runs with the console; ``--quick`` gives it a little data of its own (the churn
dataset, a training job, the audit log those calls make: well under a minute), the full run
the demo's data (``python -m gantry.client.demo --keep``: datasets, a dozen jobs, a trained and
served model with canaries, a pipeline, profiles, 1,000 outside events, an anomaly, a
compliance report). Headless Chromium (the system's, through Playwright) logs in as a
platform admin and opens every main page once to warm up, then ``REPEATS`` times; a page's
time is from navigation to its ``load`` event (the server's work and the browser's).

Figures: per page the median and the slowest load (seconds); ``slowest_median_s`` and
``slowest_max_s`` over all pages (target: under 1 s), and, as the baseline measured in the
same run and the same browser, the load time of ``/healthz`` (a page without service calls):
``slowest_ratio_to_baseline`` says how many times longer the slowest page takes.
``--screenshots DIR`` saves a picture of each page (the console tour's in docs/ come from a
full run).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit_result, median

from gantry.client.admin import create_token
from gantry.client.governance import GovernanceClient
from gantry.client.scheduler import SchedulerClient
from gantry.client.serving import ServingClient
from gantry.client.workflows import WorkflowsClient
from gantry.core.runfile import grpc_address, run_info
from gantry.testing.browser import chromium, console_tab
from gantry.testing.specs import small_training_job

REPEATS = 5


@contextlib.contextmanager
def demo_platform(data_dir: Path) -> Iterator[None]:
    """The demo, left running with its data (``--keep``) until the block ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gantry.client.demo", "--data-dir", str(data_dir), "--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"  demo | {line.rstrip()}", file=sys.stderr, flush=True)
            if "keeps running" in line:
                break
        else:
            raise SystemExit(f"the demo ended (code {proc.wait()}) before its platform was up")
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def quick_platform(data_dir: Path) -> Iterator[None]:
    """A platform with the console, the churn dataset and one finished training job."""
    from gantry.client.demo_training import POLICY, churn_columns
    from gantry.supervisor.platform import CONSOLE, DEFAULT_SERVICES, Platform, local_agents
    from gantry.training.examples.tabular import churn_table

    logs: collections.deque[str] = collections.deque(maxlen=40)
    platform = Platform(
        data_dir,
        nats_port=0,
        services=(*DEFAULT_SERVICES, CONSOLE),
        agents=local_agents(2, gpus=0),
        log_sink=logs.append,
    )
    try:
        platform.start()
    except Exception:
        print("\n".join(logs), file=sys.stderr)
        raise
    try:
        steward = create_token(data_dir, "sam-steward", ["data-steward"], dt.timedelta(hours=1))
        with GovernanceClient(platform.address("governance"), steward) as gov:
            gov.create_dataset("churn", columns=churn_columns(), description="churn (example)")
            up = gov.upload_table("churn", churn_table(3000))
            gov.commit("churn", [up.upload_id], "snapshot")
            gov.set_view_policy("churn", POLICY)
        dev = create_token(data_dir, "dev", ["ml-developer"], dt.timedelta(hours=1))
        with SchedulerClient(platform.address("scheduler"), dev) as sched:
            job = sched.submit(small_training_job("bench-console")).job
            deadline = time.monotonic() + 120
            while sched.get(job.id).state not in ("succeeded", "failed", "cancelled"):
                if time.monotonic() > deadline:
                    raise SystemExit("the quick benchmark's job did not finish in 2 minutes")
                time.sleep(0.5)
        yield
    finally:
        platform.stop()


def pages(data_dir: Path, token: str) -> list[str]:
    """The console's main pages for what this platform holds."""
    out = ["/cluster", "/jobs", "/jobs/new", "/data", "/models", "/workflows", "/audit"]

    def address(service: str) -> str:
        found = grpc_address(data_dir, service)
        assert found, f"no {service} run file"
        return found

    with SchedulerClient(address("scheduler"), token) as sched:
        jobs = sched.list(limit=50)
    if jobs:
        out.append(f"/jobs/{max(jobs, key=lambda j: j.workers).id}")
    with GovernanceClient(address("governance"), token) as gov:
        datasets = [d for d in gov.list_datasets() if d.head]
        models = gov.list_models()
    for d in datasets[:2]:
        out += [
            f"/data/{d.name}",
            f"/data/{d.name}/lineage?version={d.head}",
            f"/data/{d.name}/preview?version={d.head}&rows=20",
        ]
    if datasets:
        out.append(f"/audit/access?resource=dataset/{datasets[0].name}")
    if models:
        out.append(f"/models/{models[0].name}")
    with ServingClient(address("serving"), token) as serving:
        deployments = serving.list()
    out += [f"/models/deployments/{d.name}" for d in deployments[:2]]
    with WorkflowsClient(address("workflows"), token) as wf:
        runs = wf.runs(limit=5)
        experiments = wf.experiments()
    if runs:
        out.append(f"/workflows/runs/{runs[0].id}")
    if experiments:
        out.append(f"/workflows/experiments/{experiments[0].name}")
    out += ["/audit/integrity?index=0", "/audit/anomalies", "/audit/subjects", "/audit/reports"]
    return out


def _screenshot(page: Any, shots: Path, path: str) -> None:
    """The page as the browser window shows it (1400x900), in 256 colours (small enough for
    docs/)."""
    shots.mkdir(parents=True, exist_ok=True)
    name = path.strip("/").split("?")[0].replace("/", "-") or "home"
    if name.startswith(("jobs-j-", "workflows-runs-")):
        name = name.rsplit("-", 1)[0] if name.startswith("jobs-j-") else "workflows-run"
    if name.startswith("jobs-j"):
        name = "job"
    target = shots / f"{name}.png"
    page.screenshot(path=str(target))
    try:
        from PIL import Image
    except ImportError:  # keep the full-colour picture
        return
    with Image.open(target) as image:
        image.convert("RGB").quantize(colors=256).save(target, optimize=True)


def measure(data_dir: Path, shots: Path | None) -> dict[str, Any]:
    """Load every page ``REPEATS`` times as a platform admin; the figures."""
    token = (data_dir / "admin.token").read_text().strip()
    url = run_info(data_dir, "console", "http")
    assert url, "the console is not running"
    listed = pages(data_dir, token)
    results: dict[str, dict[str, float]] = {}
    with chromium() as browser, console_tab(browser, url, "admin", token) as tab:
        baseline = []
        for _ in range(REPEATS + 1):
            baseline.append(tab.open("/healthz"))
        for path in listed:
            times = [tab.open(path) for _ in range(REPEATS + 1)][1:]  # the first warms up
            results[path] = {"median_s": round(median(times), 4), "max_s": round(max(times), 4)}
            print(f"  {path}: median {median(times):.3f}s, max {max(times):.3f}s", file=sys.stderr)
            if shots is not None:
                _screenshot(tab.page, shots, path)
        errors = list(tab.errors)
    base = median(baseline[1:])
    slowest = max(results, key=lambda p: results[p]["median_s"])
    return {
        "pages": results,
        "pages_measured": len(results),
        "slowest_page": slowest,
        "slowest_median_s": results[slowest]["median_s"],
        "slowest_max_s": max(r["max_s"] for r in results.values()),
        "all_under_1s": all(r["max_s"] < 1.0 for r in results.values()),
        "baseline_healthz_s": round(base, 4),
        "slowest_ratio_to_baseline": round(results[slowest]["median_s"] / base, 1),
        "browser_errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a little data (< 1 minute)")
    parser.add_argument("--screenshots", type=Path, help="save a screenshot of each page here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gantry-bench-console-") as tmp:
        data_dir = Path(tmp) / "data"
        started = time.monotonic()
        with (quick_platform if args.quick else demo_platform)(data_dir):
            setup_s = time.monotonic() - started
            figures = measure(data_dir, args.screenshots)
    figures.update({"mode": "quick" if args.quick else "demo data", "setup_s": round(setup_s, 1)})
    emit_result("console", figures)
    return 0 if figures["all_under_1s"] and not figures["browser_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
