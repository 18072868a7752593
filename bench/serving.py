"""Benchmark: the serving service under closed-loop load, in the manner of Triton's perf_analyzer.

    python bench/serving.py [--quick]

Starts the real platform once (nats-server, audit, governance, serving: separate processes, as
``gantry up`` runs them; ``GANTRY_SERVING__TORCH_THREADS=1`` — one intra-op thread per model
instance, two instances fill the two cores), registers the reference models in the registry and
deploys them through the management API:

- ``mlp``: 512 -> 2048 -> 2048 -> 10 (ReLU), 5.3 M parameters, FP32 ``[-1, 512]``, exported
  with ``torch.export``; deployed twice: ``mlp-batched`` (``max_batch_size`` 32,
  ``max_queue_delay_us`` 2000, instances 1..2) and ``mlp-unbatched`` (``max_batch_size`` 1,
  instances 1..2);
- ``noop``: the identity on FP32 ``[-1, 16]`` (``max_batch_size`` 1, no queue delay): what the
  protocol, auth and batcher cost around a model that costs nothing; its version 2 is a
  deliberately broken TorchScript model (passes warm-up on random normal rows, raises on the
  bench's rows, which are all >= 0.5) for the rollback figure;
- ``lm``: the example ``CharTransformer`` (untrained weights), registered with its
  ``generation`` signature entry so that it streams text.

The load generator is a closed loop: C concurrent clients on one asyncio loop, each sending one
request of one row and sending the next when the answer arrives (perf_analyzer's
``--concurrency-range``, batch 1). Request bodies are encoded once (orjson for REST; serialised
``ModelInferRequest`` bytes with ``raw_input_contents`` for gRPC, sent on a bytes-in/bytes-out
method so the client never parses a protobuf). gRPC runs on one ``grpc.aio`` channel; REST on
one HTTP/1.1 keep-alive connection per client through :class:`Http`, a few lines of asyncio
streams (httpx.AsyncClient measured 5 ms of CPU per request at concurrency 1 and 12 ms at 32 on
this machine, which would have measured the client; this costs ~0.1 ms). After a warm-up,
measurement windows repeat until the throughput and mean latency of the last three windows are
each within 10 % of their average (perf_analyzer's stability rule) or the window limit is
reached; a level reports the throughput and p50/p90/p99 latency of those three windows, whether
they were stable, and the CPU used meanwhile, in cores: ``client`` (this process), ``server``
(the serving process, all threads), ``server_loop`` (its main thread: the event loop that runs
gRPC, REST, decoding, routing and batching; model instances compute on other threads) and
``other`` (the rest of the machine). Client and server share the machine's cores (two here):
every figure includes that contention.

Figures (headline protocol: gRPC; ``_rest`` the same over REST JSON):

- ``throughput_batched_rps`` / ``throughput_unbatched_rps``: the MLP at concurrency 32;
  ``batching_gain`` = batched / unbatched (target >= 4; Triton's dynamic batching guide shows
  272 vs ~73 inferences/s at concurrency 8 for its example); ``p99_ms_batched`` /
  ``p99_ms_unbatched`` at the same concurrency.
- ``baseline_rps`` / ``baseline_p99_ms``: a plain FastAPI endpoint (``bench/serving_baseline.py``,
  uvicorn in its own process) decoding the same JSON and running the same artefact without
  batching, under the same load at concurrency 32; ``batched_vs_baseline`` (gRPC) and
  ``batched_vs_baseline_rest`` = the service's batched throughput / baseline_rps.
- ``overhead_p50_ms_grpc`` / ``_rest``: the no-op model's p50 at concurrency 1 through the
  service minus the p50 of calling the loaded model in-process (``direct_p50_ms_noop``; target
  <= 1 ms on gRPC). The breakdown: ``floor_p50_ms_grpc`` / ``_rest`` (ServerLive and
  ``GET /v2/health/live``: the transport alone, same server), ``batcher_p50_ms_inprocess`` (the
  model through a ``DynamicBatcher`` in this process, no network) and
  ``server_loop_cpu_ms_per_request_*`` (event-loop CPU per request). ``rest_note`` appears when
  the REST floor shows responses held back by Nagle's algorithm (~40 ms each).
- ``tokens_per_s_grpc`` / ``_rest``: tokens per second of one streamed generation (gRPC
  ModelStreamInfer; REST Server-Sent Events on ``generate_stream``), greedy, medians of runs;
  ``ttft_ms_*``: time to first token; ``itl_ms_*``: mean time between tokens;
  ``tokens_per_s_grpc_4streams``: four streams at once, in all.
- ``rollback_detect_s``: with REST traffic on ``noop`` (concurrency 4), the broken version is
  deployed as a 20 % canary with a fast analysis (interval 1 s, 3 failed checks, 5 requests
  minimum, step 20 %); seconds from the first 500 the load generator sees to the moment
  GetDeployment shows ``canary.phase == "rolled_back"`` (target <= 10).

``sweep`` holds every level measured: concurrency 1, 4, 16, 32, 64 for both MLP deployments
over both protocols and for the baseline (``--quick``: 32 only, shorter windows, fewer
generations; under a minute in all, platform start included).

Prints tables on stderr as it goes, one JSON object as its LAST line on stdout, and writes it
to bench/results/serving.json.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit_result, percentile

from gantry.client.admin import create_token
from gantry.client.model_registry import ModelsClient
from gantry.client.serving import ServingClient
from gantry.core.runfile import run_info
from gantry.protos.inference import grpc_service_pb2 as ipb
from gantry.protos.inference import grpc_service_pb2_grpc as ipb_grpc
from gantry.serving.batcher import BatchingConfig, DynamicBatcher
from gantry.serving.runtime import Artifact, LoadedModel, load_model
from gantry.supervisor.platform import Platform
from gantry.training.examples.transformer import ALPHABET, CONTEXT, CharTransformer
from gantry.training.export import export_model

FEATURES, HIDDEN, CLASSES = 512, 2048, 10
NOOP_WIDTH = 16
HEADLINE_CONCURRENCY = 32
TORCH_THREADS = 1
BATCHED = {"max_batch_size": 32, "max_queue_delay_us": 2000, "min_instances": 1, "max_instances": 2}
UNBATCHED = {"max_batch_size": 1, "max_queue_delay_us": 0, "min_instances": 1, "max_instances": 2}
FAST_CANARY = {"interval_s": 1.0, "failure_threshold": 3, "min_requests": 5, "step_percent": 20}
CANARY_PERCENT = 20
ROLLBACK_CONCURRENCY = 4
PROMPT = "The old miller "
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
TARGETS = {"batching_gain": 4.0, "overhead_p50_ms_grpc": 1.0, "rollback_detect_s": 10.0}
GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]

_T0 = time.perf_counter()


@dataclass(frozen=True)
class Client:
    """One closed-loop client: ``send`` one request (True = answered 200/OK), ``close``."""

    send: Callable[[], Awaitable[bool]]
    close: Callable[[], None]


def say(text: str) -> None:
    """A progress line on stderr, stamped with the seconds since the start."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Plan:
    """How much to measure."""

    quick: bool
    levels: tuple[int, ...]
    warmup_s: float
    first_warmup_s: float  #: before a deployment's first level: the autoscaler adds instance 2
    window_s: float
    max_windows: int
    overhead_window_s: float
    gen_tokens: int
    gen_runs: int
    direct_calls: int

    @classmethod
    def make(cls, quick: bool) -> Plan:
        if quick:
            return cls(True, (HEADLINE_CONCURRENCY,), 0.5, 1.0, 0.5, 3, 0.5, 32, 2, 500)
        return cls(False, (1, 4, 16, 32, 64), 1.0, 1.5, 1.5, 6, 1.0, 64, 5, 3000)


# -- the models ------------------------------------------------------------------------------


class Mlp(nn.Module):
    """512 -> 2048 -> 2048 -> 10: 5.3 M parameters, ~10 MFLOP per row."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.ReLU(),
            nn.Linear(HIDDEN, CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


class Noop(nn.Module):
    """The identity: what serving costs around a model that costs nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Broken(nn.Module):
    """Passes warm-up (random normal rows) and raises on the bench's rows (all >= 0.5)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x >= 0.5).all()):
            raise RuntimeError("deliberately broken model")
        return x


@dataclass(frozen=True)
class Exported:
    """An exported model: its file, format and signature."""

    path: Path
    format: str
    signature: dict[str, Any]

    def artifact(self, name: str) -> Artifact:
        return Artifact(name, 1, self.path.read_bytes(), self.format, self.signature)


def export_all(directory: Path) -> dict[str, Exported]:
    """Export the four artefacts (MLP first: the baseline waits for it)."""
    out: dict[str, Exported] = {}
    for name, module, example in (
        ("mlp", Mlp().eval(), torch.rand(4, FEATURES)),
        ("noop", Noop().eval(), torch.rand(4, NOOP_WIDTH)),
    ):
        file, fmt, signature = export_model(module, example, directory / name)
        out[name] = Exported(directory / name / file, fmt, signature)
    torch.manual_seed(0)
    file, fmt, signature = export_model(
        CharTransformer().eval(), torch.zeros(2, CONTEXT, dtype=torch.long), directory / "lm"
    )
    signature["generation"] = {"vocabulary": ALPHABET, "context": CONTEXT}
    out["lm"] = Exported(directory / "lm" / file, fmt, signature)
    broken = directory / "broken.ts"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates jit
        torch.jit.save(torch.jit.script(Broken()), str(broken))  # type: ignore[no-untyped-call]
    out["broken"] = Exported(broken, "torchscript", out["noop"].signature)
    return out


# -- the environment: platform, baseline, deployments ------------------------------------------


@dataclass
class Env:
    """What the measurements talk to."""

    platform: Platform
    grpc_address: str
    rest_url: str
    admin: str
    consumer: str
    baseline_url: str
    baseline_pid: int
    broken_version: int
    models: dict[str, Exported]

    @property
    def serving_pid(self) -> int | None:
        return self.platform.pid("serving")


def start_baseline(model: Path) -> subprocess.Popen[str]:
    """``bench/serving_baseline.py`` in its own process (it says its port on stdout)."""
    script = Path(__file__).resolve().parent / "serving_baseline.py"
    return subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(model),
            "--threads",
            str(TORCH_THREADS),
            "--features",
            str(FEATURES),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def baseline_port(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> int:
    """Wait for the baseline's ``PORT n`` line."""
    assert proc.stdout is not None
    found: list[int] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("PORT "):
                found.append(int(line.split()[1]))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found:
        raise RuntimeError(f"the baseline server did not start (exit code {proc.poll()})")
    return found[0]


def start_platform(data: Path) -> Platform:
    """The platform, not started yet: audit, governance and serving."""
    return Platform(
        data,
        services=("audit", "governance", "serving"),
        nats_port=0,
        service_env={
            "GANTRY_SERVING__TORCH_THREADS": str(TORCH_THREADS),
            "GANTRY_SERVING__AUTOSCALE_INTERVAL_S": "0.5",
        },
        log_sink=lambda line: None,
    )


def setup(platform: Platform, models_dir: Path, started: list[subprocess.Popen[str]]) -> Env:
    """Start the platform (in a thread, while the models export) and the baseline (appended to
    ``started``), register the models and deploy them. The caller stops both."""
    failed: list[BaseException] = []

    def start() -> None:
        try:
            platform.start(timeout_s=90)
        except BaseException as exc:  # re-raised in the main thread
            failed.append(exc)

    starter = threading.Thread(target=start, name="platform-start")
    starter.start()
    try:
        models = export_all(models_dir)
        say(f"exported mlp ({models['mlp'].format}), noop, lm ({models['lm'].format}), broken")
        started.append(start_baseline(models["mlp"].path))
    finally:
        starter.join()
    if failed:
        raise failed[0]
    say("platform up (nats, audit, governance, serving)")
    admin = create_token(platform.data_dir, "bench-admin", ["platform-admin"])
    consumer = create_token(platform.data_dir, "bench-app", ["model-consumer"])
    with ModelsClient(platform.address("governance"), admin) as registry:
        for name in ("mlp", "noop", "lm"):
            m = models[name]
            registry.register_model(
                name, m.path, framework="pytorch", signature={**m.signature, "format": m.format}
            )
        b = models["broken"]
        broken = registry.register_model(
            "noop", b.path, framework="pytorch", signature={**b.signature, "format": b.format}
        )
    deployments: list[tuple[str, dict[str, Any]]] = [
        ("mlp", {"name": "mlp-batched", **BATCHED}),
        ("mlp", {"name": "mlp-unbatched", **UNBATCHED}),
        ("noop", {"name": "noop", "version": 1, "max_batch_size": 1, "max_queue_delay_us": 0}),
        ("lm", {"name": "lm", "max_batch_size": 8, "max_queue_delay_us": 0}),
    ]
    with (
        ServingClient(platform.address("serving"), admin) as serving,
        concurrent.futures.ThreadPoolExecutor(len(deployments)) as pool,
    ):
        for done in [pool.submit(serving.deploy, m, **kw) for m, kw in deployments]:
            done.result()
    say("deployed mlp-batched, mlp-unbatched, noop, lm")
    rest = run_info(platform.data_dir, "serving", "http")
    assert rest is not None
    baseline = started[0]
    port = baseline_port(baseline)
    return Env(
        platform=platform,
        grpc_address=platform.address("serving"),
        rest_url=str(rest),
        admin=admin,
        consumer=consumer,
        baseline_url=f"http://127.0.0.1:{port}",
        baseline_pid=baseline.pid,
        broken_version=broken.version,
        models=models,
    )


# -- requests ------------------------------------------------------------------------------------


def rows(width: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` rows of ``width`` in [0.5, 1): valid for every model, fatal for Broken."""
    rng = np.random.default_rng(seed)
    return [(0.5 + 0.5 * rng.random((1, width))).astype(np.float32) for _ in range(count)]


def rest_bodies(inputs: list[np.ndarray]) -> list[bytes]:
    """Open Inference Protocol JSON bodies, encoded once."""
    return [
        orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT__0",
                        "shape": list(x.shape),
                        "datatype": "FP32",
                        "data": x.ravel().tolist(),
                    }
                ]
            }
        )
        for x in inputs
    ]


def grpc_bodies(model: str, inputs: list[np.ndarray]) -> list[bytes]:
    """Serialised ``ModelInferRequest`` messages with the rows as ``raw_input_contents``."""
    out = []
    for x in inputs:
        request = ipb.ModelInferRequest(model_name=model)
        tensor = request.inputs.add(name="INPUT__0", datatype="FP32")
        tensor.shape.extend(x.shape)
        request.raw_input_contents.append(x.astype("<f4").tobytes())
        out.append(request.SerializeToString())
    return out


class Http:
    """A lean HTTP/1.1 keep-alive connection for one closed-loop client (one request at a time):
    requests are bytes encoded once, the answer is read by its Content-Length (or chunks).
    httpx costs several milliseconds of CPU per request on this machine, which the server would
    pay for on shared cores; this costs a few tens of microseconds."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    def request(self, method: str, path: str, body: bytes = b"", token: str = "") -> bytes:
        """The bytes of one request on this connection's server."""
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if token:
            head.append(f"Authorization: Bearer {token}")
        if body:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            # open_connection's socket is IPPROTO_TCP: asyncio sets TCP_NODELAY on it
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def call(self, request: bytes) -> tuple[int, bytes]:
        """Send ``request``; the answer's status and body."""
        reader, writer = await self._open()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at >= 0:
            body = await reader.readexactly(int(lower[at + 17 : lower.index(b"\r\n", at + 2)]))
        elif b"\r\ntransfer-encoding: chunked" in lower:
            body = b"".join([chunk async for chunk in self._chunks(reader)])
        else:
            body = await reader.read()
            self.close()
        if b"\r\nconnection: close" in lower:
            self.close()
        return status, body

    async def events(self, request: bytes) -> AsyncIterator[dict[str, Any]]:
        """Send ``request`` and yield its Server-Sent Events' data as they arrive (the
        connection is closed after: a stream is left only at its end)."""
        reader, writer = await self._open()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if int(head[9:12]) != 200:
            raise RuntimeError(f"the stream answered {head[9:12].decode()}")
        buffer = b""
        try:
            async for chunk in self._chunks(reader):
                buffer += chunk
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    if event.startswith(b"data: "):
                        yield orjson.loads(event[6:])
        finally:
            self.close()

    @staticmethod
    async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                return
            yield (await reader.readexactly(size + 2))[:-2]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def rest_client(url: str, path: str, bodies: list[bytes], token: str) -> Callable[[], Client]:
    """Closed-loop REST clients: each its own keep-alive connection (as perf_analyzer's)."""

    def make() -> Client:
        http = Http(url)
        requests = [http.request("POST", path, body, token) for body in bodies]
        count = len(requests)
        turn = [0]

        async def send() -> bool:
            turn[0] += 1
            try:
                status, _ = await http.call(requests[turn[0] % count])
            except (OSError, asyncio.IncompleteReadError, ValueError):
                http.close()
                return False
            return status == 200

        return Client(send, http.close)

    return make


def grpc_client(
    channel: grpc.aio.Channel, method: str, bodies: list[bytes], token: str
) -> Callable[[], Client]:
    """Closed-loop gRPC clients on one channel (one HTTP/2 connection), bytes in and out: no
    protobuf work per request."""
    call = channel.unary_unary(method)
    metadata = (("authorization", f"Bearer {token}"),)
    count = len(bodies)

    def make() -> Client:
        turn = [0]

        async def send() -> bool:
            turn[0] += 1
            try:
                await call(bodies[turn[0] % count], metadata=metadata, timeout=60)
            except grpc.aio.AioRpcError:
                return False
            return True

        return Client(send, lambda: None)

    return make


# -- the closed loop ---------------------------------------------------------------------------


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu(path: str) -> float:
    """User + system CPU seconds from a /proc ``stat`` file (NaN where there is none)."""
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / _TICK


def _machine_busy() -> float:
    """CPU seconds the whole machine spent busy (all cores, not idle or waiting for I/O)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _TICK


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far: this process (the load generator), the server (all threads), the
    server's main thread (its event loop) and the whole machine."""

    wall: float
    client: float
    server: float
    server_loop: float
    machine: float

    @classmethod
    def take(cls, server_pid: int | None) -> CpuSample:
        pid = server_pid or 0
        return cls(
            time.perf_counter(),
            time.process_time(),
            _stat_cpu(f"/proc/{pid}/stat"),
            _stat_cpu(f"/proc/{pid}/task/{pid}/stat"),
            _machine_busy(),
        )


@dataclass
class Level:
    """One measured point."""

    target: str
    protocol: str
    concurrency: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    windows: int
    stable: bool
    errors: int
    client_cpu_cores: float
    server_cpu_cores: float
    server_loop_cores: float
    other_cpu_cores: float

    def row(self) -> str:
        return (
            f"{self.target:<14} {self.protocol:<5} {self.concurrency:>3} {self.rps:>8.1f} "
            f"{self.p50_ms:>8.2f} {self.p90_ms:>8.2f} {self.p99_ms:>8.2f} {self.windows:>3}"
            f"{'' if self.stable else '*':<1} {self.errors:>4} {self.client_cpu_cores:>5.2f} "
            f"{self.server_cpu_cores:>5.2f} {self.server_loop_cores:>5.2f} "
            f"{self.other_cpu_cores:>5.2f}"
        )


HEADER = (
    f"{'target':<14} {'proto':<5} {'C':>3} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} "
    f"{'p99 ms':>8} {'win':>4} {'err':>4} {'cli':>5} {'srv':>5} {'loop':>5} {'other':>5}\n"
    "  (CPU cores: cli = this load generator, srv = the server process, loop = its event-loop "
    "thread, other = the rest of the machine; * = not stable)"
)


async def closed_loop(
    make: Callable[[], Client],
    concurrency: int,
    plan: Plan,
    *,
    target: str,
    protocol: str,
    server_pid: int | None,
    window_s: float | None = None,
    warmup_s: float | None = None,
) -> Level:
    """``concurrency`` clients, each sending its next request when the previous is answered;
    warm-up, then windows until three in a row are stable (or ``plan.max_windows``)."""
    window = window_s or plan.window_s
    latencies: list[float] = []
    errors = [0]
    running = [True]
    clock = time.perf_counter

    async def loop(client: Client) -> None:
        record, send = latencies.append, client.send
        while running[0]:
            started = clock()
            if await send():
                record(clock() - started)
            else:
                errors[0] += 1

    made = [make() for _ in range(concurrency)]
    clients = [asyncio.create_task(loop(client)) for client in made]
    try:
        await asyncio.sleep(warmup_s or plan.warmup_s)
        marks: list[tuple[int, float]] = [(len(latencies), clock())]
        cpu0 = CpuSample.take(server_pid)
        errors0 = errors[0]
        stable = False
        while len(marks) - 1 < plan.max_windows:
            await asyncio.sleep(window)
            marks.append((len(latencies), clock()))
            if len(marks) - 1 >= 3:
                stable = _stable(latencies, marks[-4:])
                if stable:
                    break
        cpu1 = CpuSample.take(server_pid)
    finally:
        running[0] = False
        await asyncio.gather(*clients, return_exceptions=True)
        for client in made:
            client.close()
    first, start = marks[-4] if len(marks) >= 4 else marks[0]
    last, end = marks[-1]
    sample = latencies[first:last]
    wall = end - start
    ms = [s * 1000 for s in sample]
    span = cpu1.wall - cpu0.wall
    client_cores = (cpu1.client - cpu0.client) / span
    server_cores = (cpu1.server - cpu0.server) / span
    return Level(
        target=target,
        protocol=protocol,
        concurrency=concurrency,
        rps=len(sample) / wall,
        p50_ms=percentile(ms, 50),
        p90_ms=percentile(ms, 90),
        p99_ms=percentile(ms, 99),
        mean_ms=statistics.fmean(ms) if ms else float("nan"),
        windows=len(marks) - 1,
        stable=stable,
        errors=errors[0] - errors0,
        client_cpu_cores=client_cores,
        server_cpu_cores=server_cores,
        server_loop_cores=(cpu1.server_loop - cpu0.server_loop) / span,
        # ticks of 10 ms: a quiet machine may come out a hair below zero
        other_cpu_cores=max(
            0.0, (cpu1.machine - cpu0.machine) / span - client_cores - server_cores
        ),
    )


def _stable(latencies: list[float], marks: list[tuple[int, float]]) -> bool:
    """perf_analyzer's rule: each window's throughput and mean latency within 10 % of the
    three windows' average."""
    rates, means = [], []
    for (a, t0), (b, t1) in itertools.pairwise(marks):
        if b <= a:
            return False
        rates.append((b - a) / (t1 - t0))
        means.append(statistics.fmean(latencies[a:b]))
    for values in (rates, means):
        average = statistics.fmean(values)
        if any(abs(v - average) > 0.1 * average for v in values):
            return False
    return True


# -- the measurements --------------------------------------------------------------------------


class Bench:
    """The measurements, over one environment."""

    def __init__(self, env: Env, plan: Plan) -> None:
        self.env = env
        self.plan = plan
        self.levels: list[Level] = []
        self.loadavg = [round(v, 2) for v in os.getloadavg()]
        self.mlp_rows = rows(FEATURES, 16, seed=1)
        self.noop_rows = rows(NOOP_WIDTH, 16, seed=2)

    def _keep(self, level: Level) -> Level:
        self.levels.append(level)
        say(level.row())
        return level

    async def rest_level(
        self,
        base_url: str,
        model: str,
        bodies: list[bytes],
        concurrency: int,
        *,
        target: str,
        pid: int | None,
        window_s: float | None = None,
    ) -> Level:
        make = rest_client(base_url, f"/v2/models/{model}/infer", bodies, self.env.consumer)
        return self._keep(
            await closed_loop(
                make,
                concurrency,
                self.plan,
                target=target,
                protocol="rest",
                server_pid=pid,
                window_s=window_s,
            )
        )

    async def grpc_level(
        self,
        method: str,
        bodies: list[bytes],
        concurrency: int,
        *,
        target: str,
        window_s: float | None = None,
        warmup_s: float | None = None,
    ) -> Level:
        async with grpc.aio.insecure_channel(self.env.grpc_address, GRPC_OPTIONS) as channel:
            make = grpc_client(channel, method, bodies, self.env.consumer)
            return self._keep(
                await closed_loop(
                    make,
                    concurrency,
                    self.plan,
                    target=target,
                    protocol="grpc",
                    server_pid=self.env.serving_pid,
                    window_s=window_s,
                    warmup_s=warmup_s,
                )
            )

    async def sweep(self) -> None:
        """The MLP deployments over both protocols, and the baseline, at every level."""
        say("closed-loop sweep: one row per request\n" + HEADER)
        env = self.env
        rest = rest_bodies(self.mlp_rows)
        for name in ("mlp-batched", "mlp-unbatched"):
            bodies = grpc_bodies(name, self.mlp_rows)
            for i, c in enumerate(self.plan.levels):
                first = self.plan.first_warmup_s if i == 0 else None
                await self.grpc_level(INFER, bodies, c, target=name, warmup_s=first)
        for name in ("mlp-batched", "mlp-unbatched"):
            for c in self.plan.levels:
                await self.rest_level(env.rest_url, name, rest, c, target=name, pid=env.serving_pid)
        for c in self.plan.levels:
            await self.rest_level(
                env.baseline_url, "mlp", rest, c, target="baseline", pid=env.baseline_pid
            )

    async def overhead(self) -> dict[str, float]:
        """The no-op model at concurrency 1: through the service, the transport alone, the
        batcher in-process, and the model called directly."""
        env, plan = self.env, self.plan
        noop = load_model(env.models["noop"].artifact("noop"))
        direct = direct_p50_ms(noop, self.noop_rows, plan.direct_calls)
        batcher = await batcher_p50_ms(noop, self.noop_rows, plan.direct_calls)
        say(
            f"noop in-process: model.run p50 {direct:.3f} ms, through a DynamicBatcher "
            f"p50 {batcher:.3f} ms"
        )
        say("noop and transport floor at concurrency 1\n" + HEADER)
        window = plan.overhead_window_s
        grpc_noop = await self.grpc_level(
            INFER, grpc_bodies("noop", self.noop_rows), 1, target="noop", window_s=window
        )
        grpc_floor = await self.grpc_level(LIVE, [b""], 1, target="ServerLive", window_s=window)
        rest_noop = await self.rest_level(
            env.rest_url,
            "noop",
            rest_bodies(self.noop_rows),
            1,
            target="noop",
            pid=env.serving_pid,
            window_s=window,
        )
        rest_floor = await self.rest_floor(window)
        return {
            "direct_p50_ms_noop": direct,
            "batcher_p50_ms_inprocess": batcher,
            "batcher_overhead_p50_ms": batcher - direct,
            "service_p50_ms_noop_grpc": grpc_noop.p50_ms,
            "service_p50_ms_noop_rest": rest_noop.p50_ms,
            "floor_p50_ms_grpc": grpc_floor.p50_ms,
            "floor_p50_ms_rest": rest_floor.p50_ms,
            "overhead_p50_ms_grpc": grpc_noop.p50_ms - direct,
            "overhead_p50_ms_rest": rest_noop.p50_ms - direct,
            "noop_rps_c1_grpc": grpc_noop.rps,
            "noop_rps_c1_rest": rest_noop.rps,
            "server_loop_cpu_ms_per_request_noop_grpc": loop_ms(grpc_noop),
            "server_loop_cpu_ms_per_request_floor_grpc": loop_ms(grpc_floor),
            "server_loop_cpu_ms_per_request_noop_rest": loop_ms(rest_noop),
            "server_loop_cpu_ms_per_request_floor_rest": loop_ms(rest_floor),
        }

    async def rest_floor(self, window: float) -> Level:
        """``GET /v2/health/live`` at concurrency 1: the REST transport alone."""

        def make() -> Client:
            http = Http(self.env.rest_url)
            request = http.request("GET", "/v2/health/live")

            async def send() -> bool:
                return (await http.call(request))[0] == 200

            return Client(send, http.close)

        return self._keep(
            await closed_loop(
                make,
                1,
                self.plan,
                target="health/live",
                protocol="rest",
                server_pid=self.env.serving_pid,
                window_s=window,
            )
        )

    async def generation(self) -> dict[str, float]:
        """Streamed generation over gRPC and REST SSE: tokens/s, time to first token."""
        plan, env = self.plan, self.env
        metadata = (("authorization", f"Bearer {env.consumer}"),)
        results: dict[str, list[Stream]] = {"grpc": [], "rest": []}
        async with grpc.aio.insecure_channel(env.grpc_address, GRPC_OPTIONS) as channel:
            stub = ipb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            await stream_grpc(stub, metadata, 4)  # warm-up: the connection, first batches
            await stream_rest(env.rest_url, env.consumer, 4)
            for _ in range(plan.gen_runs):
                results["grpc"].append(await stream_grpc(stub, metadata, plan.gen_tokens))
                results["rest"].append(
                    await stream_rest(env.rest_url, env.consumer, plan.gen_tokens)
                )
            started = time.perf_counter()
            together = await asyncio.gather(
                *(stream_grpc(stub, metadata, plan.gen_tokens) for _ in range(4))
            )
            four = sum(s.tokens for s in together) / (time.perf_counter() - started)
        out: dict[str, float] = {"generated_tokens_per_stream": plan.gen_tokens}
        for protocol, streams in results.items():
            out[f"tokens_per_s_{protocol}"] = statistics.median(s.tokens_per_s for s in streams)
            out[f"ttft_ms_{protocol}"] = statistics.median(s.ttft_ms for s in streams)
            out[f"itl_ms_{protocol}"] = statistics.median(s.itl_ms for s in streams)
            say(
                f"lm {protocol:<4}: {out[f'tokens_per_s_{protocol}']:.0f} tokens/s, first token "
                f"{out[f'ttft_ms_{protocol}']:.1f} ms, {out[f'itl_ms_{protocol}']:.2f} ms/token"
            )
        out["tokens_per_s_grpc_4streams"] = four
        say(f"lm grpc, 4 streams at once: {four:.0f} tokens/s in all")
        return out

    async def rollback(self) -> dict[str, Any]:
        """A broken canary on ``noop`` under REST traffic: first 500 -> rolled_back."""
        env = self.env
        bodies = rest_bodies(self.noop_rows)
        failures: list[float] = []
        running = [True]
        clock = time.perf_counter

        async def loop(http: Http, request: bytes) -> None:
            while running[0]:
                status, _ = await http.call(request)
                if status >= 500:
                    failures.append(clock())

        made = [Http(env.rest_url) for _ in range(ROLLBACK_CONCURRENCY)]
        clients = [
            asyncio.create_task(
                loop(http, http.request("POST", "/v2/models/noop/infer", body, env.consumer))
            )
            for http, body in zip(made, bodies, strict=False)
        ]
        with ServingClient(env.grpc_address, env.admin) as serving:
            try:
                await asyncio.sleep(0.3)
                info = await asyncio.to_thread(
                    serving.deploy,
                    "noop",
                    name="noop",
                    version=env.broken_version,
                    canary_percent=CANARY_PERCENT,
                    canary=FAST_CANARY,
                )
                ready = clock()
                phase = info.canary.phase
                while phase == "progressing" and clock() < ready + 30:
                    await asyncio.sleep(0.05)
                    phase = (await asyncio.to_thread(serving.get, "noop")).canary.phase
                settled = clock()
            finally:
                running[0] = False
                await asyncio.gather(*clients, return_exceptions=True)
                for client in made:
                    client.close()
        if phase != "rolled_back" or not failures:
            say(f"rollback: canary phase {phase!r}, {len(failures)} failed requests")
            return {"rollback_detect_s": None, "rollback_phase": phase}
        detect = settled - failures[0]
        say(
            f"rollback: first 500 -> rolled_back in {detect:.2f} s ({settled - ready:.2f} s "
            f"after the canary was ready; {len(failures)} requests failed)"
        )
        return {
            "rollback_detect_s": detect,
            "rollback_after_canary_ready_s": settled - ready,
            "canary_failed_requests": len(failures),
        }


def loop_ms(level: Level) -> float:
    """CPU milliseconds the server's event-loop thread spent per request."""
    return 1000 * level.server_loop_cores / level.rps


def process_age_s() -> float:
    """Seconds since this process started (imports included)."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return float(Path("/proc/uptime").read_text().split()[0]) - started / _TICK
    except (OSError, IndexError, ValueError):
        return time.perf_counter() - _T0


def direct_p50_ms(model: LoadedModel, inputs: list[np.ndarray], calls: int) -> float:
    """The p50 of ``model.run`` on one row, in this process."""
    for x in inputs:
        model.run([x])
    clock = time.perf_counter
    times: list[float] = []
    for i in range(calls):
        x = inputs[i % len(inputs)]
        started = clock()
        model.run([x])
        times.append((clock() - started) * 1000)
    return percentile(times, 50)


async def batcher_p50_ms(model: LoadedModel, inputs: list[np.ndarray], calls: int) -> float:
    """The p50 of one row through a :class:`DynamicBatcher` (batch 1, no delay, metrics on)
    in this process: queueing, the hand-off to the instance thread and back."""
    batcher = DynamicBatcher(
        model.run,
        BatchingConfig(max_batch_size=1, max_queue_delay_us=0),
        labels={"deployment": "bench-inprocess", "version": "1"},
    )
    clock = time.perf_counter
    times: list[float] = []
    try:
        for i in range(calls + 50):
            x = inputs[i % len(inputs)]
            started = clock()
            await batcher.submit([x])
            if i >= 50:
                times.append((clock() - started) * 1000)
    finally:
        await batcher.close()
    return percentile(times, 50)


@dataclass(frozen=True)
class Stream:
    """One streamed generation."""

    tokens: int
    ttft_ms: float
    total_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s

    @property
    def itl_ms(self) -> float:
        return (self.total_s * 1000 - self.ttft_ms) / max(1, self.tokens - 1)


def _generate_request(max_tokens: int) -> ipb.ModelInferRequest:
    request = ipb.ModelInferRequest(model_name="lm")
    tensor = request.inputs.add(name="text_input", datatype="BYTES")
    tensor.shape.append(1)
    tensor.contents.bytes_contents.append(PROMPT.encode())
    request.parameters["max_tokens"].int64_param = max_tokens
    request.parameters["temperature"].double_param = 0.0
    return request


async def stream_grpc(stub: Any, metadata: Any, max_tokens: int) -> Stream:
    """One generation on Triton's ModelStreamInfer."""
    clock = time.perf_counter
    started = clock()
    first = 0.0
    tokens = 0
    call = stub.ModelStreamInfer(iter([_generate_request(max_tokens)]), metadata=metadata)
    async for reply in call:
        if reply.error_message:
            raise RuntimeError(f"generation failed: {reply.error_message}")
        tokens += 1
        if tokens == 1:
            first = clock()
        final = reply.infer_response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            break
    end = clock()
    call.cancel()
    return Stream(tokens, (first - started) * 1000, end - started)


async def stream_rest(url: str, token: str, max_tokens: int) -> Stream:
    """One generation on ``generate_stream`` (Server-Sent Events)."""
    body = orjson.dumps(
        {"text_input": PROMPT, "parameters": {"max_tokens": max_tokens, "temperature": 0.0}}
    )
    http = Http(url)
    request = http.request("POST", "/v2/models/lm/generate_stream", body, token)
    clock = time.perf_counter
    started = clock()
    first = 0.0
    tokens = 0
    async for doc in http.events(request):
        if "error" in doc:
            raise RuntimeError(f"generation failed: {doc['error']}")
        tokens += 1
        if tokens == 1:
            first = clock()
        if doc.get("final"):
            break
    return Stream(tokens, (first - started) * 1000, clock() - started)


# -- figures ---------------------------------------------------------------------------------


def pick(levels: list[Level], target: str, protocol: str, concurrency: int) -> Level:
    for level in levels:
        if (level.target, level.protocol, level.concurrency) == (target, protocol, concurrency):
            return level
    raise KeyError((target, protocol, concurrency))


def figures(
    bench: Bench, overhead: dict[str, float], gen: dict[str, float], rollback: dict[str, float]
) -> dict[str, Any]:
    levels, c = bench.levels, HEADLINE_CONCURRENCY
    out: dict[str, Any] = {
        "benchmark": "serving",
        "headline_protocol": "grpc",
        "headline_concurrency": c,
    }
    for protocol, suffix in (("grpc", ""), ("rest", "_rest")):
        batched = pick(levels, "mlp-batched", protocol, c)
        unbatched = pick(levels, "mlp-unbatched", protocol, c)
        out[f"throughput_batched_rps{suffix}"] = batched.rps
        out[f"throughput_unbatched_rps{suffix}"] = unbatched.rps
        out[f"batching_gain{suffix}"] = batched.rps / unbatched.rps
        out[f"p99_ms_batched{suffix}"] = batched.p99_ms
        out[f"p99_ms_unbatched{suffix}"] = unbatched.p99_ms
        out[f"p50_ms_batched{suffix}"] = batched.p50_ms
        out[f"p50_ms_unbatched{suffix}"] = unbatched.p50_ms
        out[f"server_cpu_ms_per_request_batched{suffix}"] = (
            1000 * batched.server_cpu_cores / batched.rps
        )
        out[f"server_cpu_ms_per_request_unbatched{suffix}"] = (
            1000 * unbatched.server_cpu_cores / unbatched.rps
        )
        out[f"server_loop_cpu_ms_per_request_batched{suffix}"] = (
            1000 * batched.server_loop_cores / batched.rps
        )
        out[f"server_loop_cpu_ms_per_request_unbatched{suffix}"] = (
            1000 * unbatched.server_loop_cores / unbatched.rps
        )
        out[f"client_cpu_ms_per_request{suffix}"] = 1000 * batched.client_cpu_cores / batched.rps
    baseline = pick(levels, "baseline", "rest", c)
    out["baseline_rps"] = baseline.rps
    out["baseline_p99_ms"] = baseline.p99_ms
    out["batched_vs_baseline"] = out["throughput_batched_rps"] / baseline.rps
    out["batched_vs_baseline_rest"] = out["throughput_batched_rps_rest"] / baseline.rps
    out["overhead_p50_ms"] = overhead["overhead_p50_ms_grpc"]
    out.update(overhead)
    out.update(gen)
    out.update(rollback)
    out["overhead_beyond_transport_p50_ms_grpc"] = (
        overhead["service_p50_ms_noop_grpc"] - overhead["floor_p50_ms_grpc"]
    )
    out["overhead_beyond_transport_p50_ms_rest"] = (
        overhead["service_p50_ms_noop_rest"] - overhead["floor_p50_ms_rest"]
    )
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
    out["sweep"] = [
        {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(level).items()}
        for level in levels
    ]
    out["targets"] = TARGETS
    detect = out.get("rollback_detect_s")
    out["met"] = {
        "batching_gain": out["batching_gain"] >= TARGETS["batching_gain"],
        "overhead_p50_ms_grpc": out["overhead_p50_ms_grpc"] <= TARGETS["overhead_p50_ms_grpc"],
        "rollback_detect_s": detect is not None and detect <= TARGETS["rollback_detect_s"],
    }
    if out["floor_p50_ms_rest"] >= 30:
        out["rest_note"] = (
            f"GET /v2/health/live takes {out['floor_p50_ms_rest']:.0f} ms at concurrency 1: "
            "responses wait for the client's delayed ACK (~40 ms), i.e. the REST listening "
            "socket lacks TCP_NODELAY (asyncio sets it on accepted connections only when the "
            "socket was created with proto IPPROTO_TCP); the REST figures measure that"
        )
    out["machine"] = {
        "cpu_count": os.cpu_count(),
        "torch_threads_per_instance": TORCH_THREADS,
        "loadavg_at_start": bench.loadavg,
        "loadavg_at_end": [round(v, 2) for v in os.getloadavg()],
        "note": f"client and server share {os.cpu_count()} cores: the load generator's CPU "
        "(client_cpu_cores in the sweep) is taken from the service's; other_cpu_cores is what "
        "the rest of the machine used meanwhile (nats, audit, governance, other users)",
    }
    out["models"] = {
        "mlp": {
            "params": sum(p.numel() for p in Mlp().parameters()),
            "shape": [-1, FEATURES],
            "format": bench.env.models["mlp"].format,
        },
        "noop": {"shape": [-1, NOOP_WIDTH], "format": bench.env.models["noop"].format},
        "lm": {"format": bench.env.models["lm"].format, "context": CONTEXT},
    }
    out["deployments"] = {
        "mlp-batched": BATCHED,
        "mlp-unbatched": UNBATCHED,
        "canary": {**FAST_CANARY, "percent": CANARY_PERCENT},
    }
    return out


async def measure(env: Env, plan: Plan) -> dict[str, Any]:
    bench = Bench(env, plan)
    overhead = await bench.overhead()
    await bench.sweep()
    gen = await bench.generation()
    rollback = await bench.rollback()
    return figures(bench, overhead, gen, rollback)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="concurrency 32 only, short windows (< 1 minute)"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the platform on the way out
    logging.disable(logging.WARNING)
    torch.set_num_threads(TORCH_THREADS)
    plan = Plan.make(args.quick)
    with tempfile.TemporaryDirectory(prefix="gantry-bench-serving-") as tmp:
        platform = start_platform(Path(tmp) / "data")
        baseline: list[subprocess.Popen[str]] = []
        try:
            env = setup(platform, Path(tmp) / "models", baseline)
            result = asyncio.run(measure(env, plan))
        finally:
            for proc in baseline:
                proc.terminate()
            platform.stop()
            for proc in baseline:
                proc.wait(10)
    result["quick"] = args.quick
    result["duration_s"] = round(process_age_s(), 1)
    say(
        f"batching gain {result['batching_gain']:.2f}x (gRPC), {result['batching_gain_rest']:.2f}x "
        f"(REST); overhead p50 {result['overhead_p50_ms_grpc']:.3f} ms gRPC, "
        f"{result['overhead_p50_ms_rest']:.3f} ms REST; rollback "
        f"{result.get('rollback_detect_s')} s; {result['duration_s']} s in all"
    )
    emit_result("serving", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
