"""`gantry profile` and the profiler SDK against a fake profiler service on a free port.

The fake answers in the protocol's shapes with a realistic picture: a 2-rank job whose rank 1
straggles in the data phase (the other rank waits for it in comm), an input-bound verdict that
has cleared, two nodes of which one is degraded, and a trace whose files become ready after a
poll. It records every request, so tests can check what went over the wire.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from gantry.client import cli
from gantry.client.cli import _profile
from gantry.client.errors import RemoteNotFound
from gantry.client.profile_plots import html_job, plot_job, plot_nodes, verdict
from gantry.client.profiler import ClusterInfo, JobProfileInfo, NodeInfo, ProfilerClient
from gantry.core import IntegrityError, InvalidInput, Unauthenticated
from gantry.core.runfile import write_run_file
from gantry.protos.v1 import profiler_pb2 as pb
from gantry.protos.v1 import profiler_pb2_grpc as pb_grpc

TOKEN = "admin-token"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: What the fake streams for every ready trace file: incompressible, several chunks long.
TRACE_BYTES = random.Random(7).randbytes(150_000)
CHUNK = 64 << 10
#: The verdict in words, with characters HTML must escape.
SUMMARY = (
    "rank 1 on node-b is a straggler: 1.32x the busy time of the other ranks (250.0 vs 190.0 "
    "ms per step), 60.0 ms more in loading data; the others wait 60.0 ms per step for it. "
    "Cause: slow data loading (reads < 40 MB/s & 2 loader workers)."
)
EVIDENCE = {
    "ratio": 1.316,
    "busy_ms": 250.0,
    "others_busy_ms": 190.0,
    "excess_ms": 60.0,
    "others_wait_ms": 60.0,
    "phase_excess_ms": {"data": 60.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0},
    "steps_judged": 40,
    "windows": 4,
}


def _times(data: float, comm: float) -> pb.PhaseTimes:
    busy = data + 60.0 + 110.0 + 10.0
    return pb.PhaseTimes(
        step_ms=busy + comm, data_ms=data, forward_ms=60.0, backward_ms=110.0,
        optimizer_ms=10.0, comm_ms=comm, busy_ms=busy, samples_per_step=32,
        tokens_per_step=65536,
    )  # fmt: skip


def _rank(rank: int, node: str) -> pb.RankProfile:
    """Rank 1 loads data slowly from step 130 on; rank 0 waits for it in comm."""
    points = []
    for last in range(10, 301, 10):
        slow = 70.0 if last > 130 else 10.0
        data, comm = (slow, 0.0) if rank == 1 else (10.0, slow - 10.0)
        points.append(
            pb.RankPoint(
                first_step=last - 9,
                last_step=last,
                at_ms=1_700_000_000_000 + last * 250,
                times=_times(data, comm),
                loss=2.0 - last / 300,
                has_loss=True,
                memory_mib=30_000,
            )
        )
    recent = _times(70.0, 0.0) if rank == 1 else _times(10.0, 60.0)
    return pb.RankProfile(
        rank=rank, node=node, recent=recent, overall=recent, last_step=300, memory_mib=31_000,
        timeline=points,
    )  # fmt: skip


JOB = pb.JobProfile(
    job_id="job-42", attempt=1, name="llama-ft", owner="sam", state="running", world_size=2,
    ranks=[_rank(0, "node-a"), _rank(1, "node-b")],
    findings=[
        pb.Finding(kind="straggler", state="raised", rank=1, node="node-b", phase="data",
                   cause="slow_data_loading", summary=SUMMARY, evidence_json=json.dumps(EVIDENCE),
                   raised_step=140, step=300, raised_ms=1_700_000_035_000),
        pb.Finding(kind="input_bound", state="cleared", rank=-1, phase="data",
                   summary="input-bound: the ranks spend 41% of each step waiting for data",
                   evidence_json='{"share": 0.41, "threshold": 0.3}', raised_step=40, step=90,
                   raised_ms=1_700_000_010_000, cleared_ms=1_700_000_022_500),
    ],
    samples_per_s=256.0, compute_fraction=0.68, last_step=300, started_ms=1_700_000_000_000,
    updated_ms=1_700_000_075_000, attempts=[0, 1], gpu_util=0.62,
)  # fmt: skip

NODES = pb.ListNodesResponse(
    nodes=[
        pb.NodeHealth(node="node-a", state="ok", cpu_util=0.35, gpu_util=0.71, gpus=8,
                      gpus_allocated=4, cpu_allocated=16, cpus=64, memory_used_mib=120_000,
                      net_rx_bytes_per_s=2.5e9, net_tx_bytes_per_s=2.4e9, jobs=["job-42"],
                      temperature_c=71, power_w=2400, last_seen_ms=1_700_000_075_000),
        pb.NodeHealth(node="node-b", state="degraded",
                      reason="slow in 2 jobs recently (slow_data_loading)",
                      evidence_json='{"jobs": ["job-42", "job-17"]}', since_ms=1_700_000_040_000,
                      cpu_util=0.93, gpu_util=0.31, gpus=8, gpus_allocated=6, cpu_allocated=24,
                      cpus=64, net_rx_bytes_per_s=4.0e7, net_tx_bytes_per_s=3.5e7,
                      throttled=True, jobs=["job-42", "job-17"], slow_jobs=2, temperature_c=88,
                      power_w=1900, last_seen_ms=1_700_000_075_000),
    ],
    cluster=pb.ClusterUtilisation(nodes=2, degraded=1, gpus=16, gpus_allocated=10,
                                  gpus_busy=8.16, cpus=128, cpus_allocated=40, cpus_busy=81.9,
                                  running_jobs=2),
)  # fmt: skip


@dataclass
class FakeProfiler(pb_grpc.ProfilerServiceServicer):
    """Canned answers; every request kept in ``requests``."""

    requests: list[Any] = field(default_factory=list)
    polls_until_ready: int = 1  # GetTrace answers pending this many times
    polls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _check(self, request: Any, context: grpc.ServicerContext) -> None:
        meta = dict(context.invocation_metadata())
        if meta.get("authorization") != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        with self.lock:
            self.requests.append(request)

    def last(self, kind: type[Any]) -> Any:
        """The last request of this message type."""
        return next(r for r in reversed(self.requests) if isinstance(r, kind))

    def GetJobProfile(self, request: pb.GetJobProfileRequest, context: Any) -> pb.JobProfile:
        self._check(request, context)
        if request.job_id not in ("job-42", "llama-ft"):
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id!r} not found")
        return JOB

    def ListNodes(self, request: pb.ListNodesRequest, context: Any) -> pb.ListNodesResponse:
        self._check(request, context)
        return NODES

    def SetNodeHealth(self, request: pb.SetNodeHealthRequest, context: Any) -> pb.NodeHealth:
        self._check(request, context)
        node = next((n for n in NODES.nodes if n.node == request.node), None)
        if node is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"node {request.node!r} not found")
            raise AssertionError("abort raises")
        answer = pb.NodeHealth()
        answer.CopyFrom(node)
        answer.state = "degraded" if request.degraded else "ok"
        answer.reason = request.reason
        return answer

    def _trace(self, state: str, ranks: list[int] | None = None) -> pb.Trace:
        digest = hashlib.sha256(TRACE_BYTES).hexdigest()
        files = [
            pb.TraceFile(
                rank=r,
                node=f"node-{'ab'[r]}",
                state=state,
                first_step=301,
                steps=5,
                bytes=len(TRACE_BYTES) if state == "ready" else 0,
                sha256=digest if state == "ready" else "",
            )
            for r in (ranks or [0, 1])
        ]
        return pb.Trace(
            trace_id="tr-7",
            job_id="job-42",
            attempt=1,
            steps=5,
            state=state,
            requested_by="sam",
            requested_ms=1_700_000_076_000,
            files=files,
        )

    def StartTrace(self, request: pb.StartTraceRequest, context: Any) -> pb.Trace:
        self._check(request, context)
        return self._trace("pending", list(request.ranks))

    def GetTrace(self, request: pb.GetTraceRequest, context: Any) -> pb.Trace:
        self._check(request, context)
        if request.trace_id != "tr-7":
            context.abort(grpc.StatusCode.NOT_FOUND, f"trace {request.trace_id!r} not found")
        with self.lock:
            self.polls += 1
            ready = self.polls > self.polls_until_ready
        return self._trace("ready" if ready else "pending")

    def ListTraces(self, request: pb.ListTracesRequest, context: Any) -> pb.ListTracesResponse:
        self._check(request, context)
        return pb.ListTracesResponse(traces=[self._trace("ready")])

    def DownloadTrace(self, request: pb.DownloadTraceRequest, context: Any) -> Iterator[pb.Chunk]:
        self._check(request, context)
        if request.trace_id != "tr-7" or request.rank not in (0, 1):
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no file of rank {request.rank} in trace {request.trace_id!r}",
            )
        for at in range(0, len(TRACE_BYTES), CHUNK):
            yield pb.Chunk(data=TRACE_BYTES[at : at + CHUNK])

    def UploadTrace(self, request_iterator: Iterator[Any], context: Any) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the CLI never uploads")


@dataclass
class Running:
    address: str
    service: FakeProfiler


@pytest.fixture
def profiler() -> Iterator[Running]:
    """A fresh fake profiler on a free local port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service = FakeProfiler()
    pb_grpc.add_ProfilerServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield Running(f"127.0.0.1:{port}", service)
    server.stop(None).wait()


@pytest.fixture
def client(profiler: Running) -> Iterator[ProfilerClient]:
    with ProfilerClient(profiler.address, TOKEN, timeout_s=10) as c:
        yield c


# ---------------------------------------------------------------------- the SDK


def test_a_profile_arrives_as_plain_records(profiler: Running, client: ProfilerClient) -> None:
    profile = client.job_profile("llama-ft", attempt=1, max_points=50)
    sent = profiler.service.last(pb.GetJobProfileRequest)
    assert (sent.job_id, sent.attempt, sent.max_points) == ("llama-ft", 1, 50)
    assert isinstance(profile, JobProfileInfo)
    assert (profile.job_id, profile.name, profile.attempts) == ("job-42", "llama-ft", (0, 1))
    slow = profile.ranks[1]
    assert (slow.node, slow.recent.data_ms, slow.recent.phase("comm")) == ("node-b", 70.0, 0.0)
    assert slow.timeline[-1].last_step == 300 and slow.timeline[-1].loss == pytest.approx(1.0)
    straggler = profile.straggler
    assert straggler is not None and straggler.rank == 1 and straggler.evidence == EVIDENCE
    (cleared,) = profile.cleared
    assert cleared.rank is None and cleared.evidence == {"share": 0.41, "threshold": 0.3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.state = "ended"  # type: ignore[misc]
    with pytest.raises(InvalidInput, match="unknown phase 'io'"):
        slow.recent.phase("io")


def test_nodes_traces_and_errors(profiler: Running, client: ProfilerClient) -> None:
    nodes, cluster = client.nodes()
    assert [(n.node, n.degraded) for n in nodes] == [("node-a", False), ("node-b", True)]
    assert nodes[1].evidence == {"jobs": ["job-42", "job-17"]}
    assert nodes[0].used == pytest.approx(0.71 * 8) and nodes[0].unit == "GPUs"
    assert (cluster.gpus_allocated, cluster.degraded) == (10, 1)
    trace = client.start_trace("job-42", steps=5, ranks=(1, 1, 0))
    assert list(profiler.service.last(pb.StartTraceRequest).ranks) == [0, 1]
    assert trace.state == "pending" and not trace.done
    assert [t.trace_id for t in client.traces("job-42")] == ["tr-7"]
    with pytest.raises(RemoteNotFound, match="job 'nope' not found"):
        client.job_profile("nope")
    with pytest.raises(InvalidInput, match=r"steps must be 1\.\.1000"):
        client.start_trace("job-42", steps=0)
    with pytest.raises(InvalidInput, match="a job id or name is needed"):
        client.traces(" ")
    with ProfilerClient(profiler.address, "stolen") as stranger:
        with pytest.raises(Unauthenticated, match="unknown token"):
            stranger.nodes()


def test_download_writes_exactly_the_streamed_bytes(client: ProfilerClient, tmp_path: Path) -> None:
    digest = hashlib.sha256(TRACE_BYTES).hexdigest()
    seen: list[int] = []
    dest = client.download_trace(
        "tr-7", 1, tmp_path / "t" / "rank1.json.gz", sha256=digest, progress=seen.append
    )
    assert dest.read_bytes() == TRACE_BYTES
    assert len(seen) == 3 and sum(seen) == len(TRACE_BYTES)  # 150 kB in 64 kB chunks

    damaged = tmp_path / "damaged.json.gz"
    with pytest.raises(IntegrityError, match="arrived damaged"):
        client.download_trace("tr-7", 0, damaged, sha256="0" * 64)
    missing = tmp_path / "missing.json.gz"
    with pytest.raises(RemoteNotFound, match="no file of rank 5"):
        client.download_trace("tr-7", 5, missing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]  # no partial file anywhere
    assert [p.name for p in (tmp_path / "t").iterdir()] == ["rank1.json.gz"]


# ---------------------------------------------------------------------- pictures


def _png(path: Path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes"
    return data


def test_pictures_of_odd_profiles_and_cpu_nodes(tmp_path: Path) -> None:
    empty = JobProfileInfo.from_pb(pb.JobProfile(job_id="job-1", state="running"))
    assert verdict(empty) == "no standing findings"
    _png(plot_job(empty, tmp_path / "empty.png"))
    page = html_job(empty)
    assert "<p>none</p>" in page and "job-1" in page

    hostile = pb.JobProfile()
    hostile.CopyFrom(JOB)
    hostile.ranks[0].node = "<script>alert(1)</script>"
    page = html_job(JobProfileInfo.from_pb(hostile))
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page

    cpu = NodeInfo.from_pb(
        pb.NodeHealth(node="cpu-1", state="ok", cpus=32, cpu_allocated=8, cpu_util=0.25)
    )
    assert (cpu.unit, cpu.allocated, cpu.used, cpu.capacity) == ("CPUs", 8, 8.0, 32)
    mixed = [NodeInfo.from_pb(n) for n in NODES.nodes] + [cpu]
    _png(plot_nodes(mixed, ClusterInfo.from_pb(NODES.cluster), tmp_path / "mixed.png"))


# ---------------------------------------------------------------------- the CLI


@dataclass
class Result:
    code: int
    out: str
    err: str


Gantry = Callable[..., Result]


@pytest.fixture
def data_dir(profiler: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data directory whose run file points at the fake, and the token in the environment."""
    port = int(profiler.address.rsplit(":", 1)[1])
    write_run_file(tmp_path, "profiler", host="127.0.0.1", grpc_port=port, metrics_port=0)
    monkeypatch.setenv("GANTRY_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GANTRY_TOKEN", TOKEN)
    monkeypatch.delenv("GANTRY_PROFILER_ADDR", raising=False)
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(_profile, "POLL_S", 0.01)
    return tmp_path


@pytest.fixture
def gantry(data_dir: Path) -> Gantry:
    """Run ``gantry ARGS`` with typer's CliRunner; no traceback may reach the user."""
    runner = CliRunner()

    def run(*args: str | Path) -> Result:
        result = runner.invoke(cli.app, [str(a) for a in args])
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert "Traceback" not in result.output
        return Result(result.exit_code, result.stdout, result.stderr)

    return run


def test_job_prints_ranks_and_the_verdict_in_words(gantry: Gantry) -> None:
    r = gantry("profile", "job", "llama-ft")
    assert r.code == 0, r.err
    assert "job llama-ft (job-42), attempt 1 of 0, 1: running" in r.out
    assert "256.0 samples/s, compute (forward+backward) 68% of step time" in r.out
    rows = {x.split("│")[1].strip(): x for x in r.out.splitlines() if x.startswith("│")}
    cells = [c.strip() for c in rows["1"].split("│")[1:-1]]
    assert cells == [
        "1",
        "node-b",
        "300",
        "70.0",
        "60.0",
        "110.0",
        "10.0",
        "0.0",
        "250.0",
        "32",
        "65536",
    ]
    assert [c.strip() for c in rows["0"].split("│")[1:-1]][3] == "10.0"
    assert "rank 1 on node-b is a straggler: 1.32x the others' busy time, data phase" in r.out
    assert "raised straggler since step 140: rank 1 on node-b is a straggler" in r.out
    assert (
        "evidence: 1.32x the others' busy time; 60.0 ms more per step; the others wait 60.0 ms "
        "per step; phase data; cause slow data loading"
    ) in r.out
    assert "input bound: raised at step 40, cleared at step 90" in r.out


def test_job_writes_a_png_and_a_self_contained_html_page(gantry: Gantry, tmp_path: Path) -> None:
    png, page = tmp_path / "out" / "job.png", tmp_path / "job.html"
    r = gantry("profile", "job", "job-42", "--plot", png, "--html", page)
    assert r.code == 0, r.err
    assert f"wrote the plot to {png}" in r.out and f"wrote the HTML page to {page}" in r.out
    _png(png)
    text = page.read_text()
    assert '<table class="ranks">' in text
    assert text.count("<tr") == 3 + len(EVIDENCE) + 2  # ranks: header + 2; both evidences
    assert '<tr class="straggler"><td>1</td><td class="text">node-b</td>' in text
    assert "reads &lt; 40 MB/s &amp; 2 loader workers" in text and SUMMARY not in text
    assert text.count("<svg") == 2 and "<polyline" in text
    for forbidden in ("http://", "https://", "<script", "src=", "<link", "@import", "perfetto"):
        assert forbidden not in text, forbidden


def test_job_json_parses_and_stays_alone_on_stdout(gantry: Gantry, tmp_path: Path) -> None:
    r = gantry("profile", "job", "job-42", "--json", "--plot", tmp_path / "j.png")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["job_id"] == "job-42" and data["ranks"][1]["recent"]["data_ms"] == 70.0
    assert data["findings"][0]["evidence"]["others_wait_ms"] == 60.0
    assert "wrote the plot" in r.err
    _png(tmp_path / "j.png")


def test_not_found_and_bad_options_are_one_line_errors(gantry: Gantry, data_dir: Path) -> None:
    r = gantry("profile", "job", "nope")
    assert r.code == 2 and r.err.strip() == "gantry: error: job 'nope' not found"
    r = gantry("profile", "job", "job-42", "--plot", data_dir / "job.svg")
    assert r.code == 2 and "--plot" in r.err and "should end in .png" in r.err
    (data_dir / "run" / "profiler.json").unlink()
    r = gantry("profile", "nodes")
    assert r.code == 2 and "don't know where the profiler service is" in r.err
    assert "GANTRY_PROFILER_ADDR" in r.err


def test_nodes_table_cluster_line_plot_and_json(
    gantry: Gantry, profiler: Running, tmp_path: Path
) -> None:
    r = gantry("profile", "nodes", "--plot", tmp_path / "nodes.png")
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if "node-b" in x and "│" in x)
    cells = [c.strip() for c in line.split("│")[1:-1]]
    assert cells[:6] == [
        "node-b",
        "degraded",
        "slow in 2 jobs recently (slow_data_loading)",
        "93%",
        "31%",
        "6/2.5 of 8 GPUs",
    ]
    assert cells[6:10] == ["yes", "88 °C", "40.0 MB/s / 35.0 MB/s", "2"]
    assert (
        "cluster: 2 nodes, 1 degraded, 2 running jobs; GPUs allocated 10, busy 8.2 (of 16); "
        "CPUs allocated 40, busy 81.9 (of 128)"
    ) in r.out
    _png(tmp_path / "nodes.png")
    data = json.loads(gantry("profile", "nodes", "--json").out)
    assert [n["state"] for n in data["nodes"]] == ["ok", "degraded"]
    assert data["cluster"]["gpus_busy"] == pytest.approx(8.16)


def test_mark_sends_the_operators_decision(gantry: Gantry, profiler: Running) -> None:
    r = gantry("profile", "mark", "node-b", "--recovered", "--reason", "disk replaced")
    assert r.code == 0, r.err
    sent = profiler.service.last(pb.SetNodeHealthRequest)
    assert (sent.node, sent.degraded, sent.reason) == ("node-b", False, "disk replaced")
    assert "node node-b is now ok: disk replaced" in r.out
    r = gantry("profile", "mark", "node-a", "--degraded")
    sent = profiler.service.last(pb.SetNodeHealthRequest)
    assert r.code == 0 and (sent.node, sent.degraded, sent.reason) == ("node-a", True, "")
    assert "node node-a is now degraded" in r.out
    before = len(profiler.service.requests)
    r = gantry("profile", "mark", "node-a")
    assert r.code == 2 and "--degraded or --recovered" in r.err
    assert len(profiler.service.requests) == before  # refused before any call


def test_trace_waits_downloads_and_says_how_to_open(
    gantry: Gantry, profiler: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    r = gantry("profile", "trace", "llama-ft", "--steps", "5", "--rank", "1", "--rank", "0")
    assert r.code == 0, r.err
    sent = profiler.service.last(pb.StartTraceRequest)
    assert (sent.job_id, sent.steps, list(sent.ranks)) == ("llama-ft", 5, [0, 1])
    assert profiler.service.polls == 2  # pending once, then ready
    for rank in (0, 1):
        path = tmp_path / "traces" / "tr-7" / f"rank{rank}.json.gz"
        assert path.read_bytes() == TRACE_BYTES
        assert f"rank {rank} (node-{'ab'[rank]}, steps 301..305): traces/tr-7/rank{rank}" in r.out
    assert "https://ui.perfetto.dev" in r.out and "chrome://tracing" in r.out

    r = gantry("profile", "trace", "job-42", "--steps", "5", "--out", tmp_path / "x", "--no-wait")
    assert r.code == 0 and "follow it with 'gantry profile traces job-42'" in r.out
    assert not (tmp_path / "x").exists()


def test_trace_gives_up_after_the_timeout(gantry: Gantry, profiler: Running) -> None:
    profiler.service.polls_until_ready = 10**6
    r = gantry("profile", "trace", "job-42", "--steps", "3", "--timeout", "0.2")
    assert r.code == 1
    assert "trace tr-7 is still pending after 0.2s" in r.out
    assert profiler.service.polls >= 2


def test_traces_lists_them(gantry: Gantry) -> None:
    r = gantry("profile", "traces", "job-42")
    assert r.code == 0, r.err
    assert "1 trace of job-42" in r.out
    cells = [c.strip() for c in next(x for x in r.out.splitlines() if "tr-7" in x).split("│")]
    assert cells[1:7] == ["tr-7", "ready", "1", "5", "2/2", "sam"]
