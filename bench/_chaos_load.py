"""The chaos bench's steady traffic: serving calls, dataset reads and outside events.

Each load runs in a thread of its own until :meth:`Load.stop` and records every call as a
:class:`Call` (its start and end on the bench's clock, and whether it worked), so the report
can tell calls inside kill windows from those outside. Clients look the service's address up
again after a failure: a restarted service listens on a new port (the platform gives every
service a free one), as a Kubernetes Service would hide.

- :class:`ServingLoad`: gRPC ``ModelInfer`` on the probe model, paced at a fixed rate (a call
  is sent every ``interval_s`` whether the last one worked or not, so errors count time), with
  a short deadline.
- :class:`ReadLoad`: the annotator reads the committed version raw through the governance API
  and checks the row count.
- :class:`EventLoad`: an outside service (a service account's key, the NATS ``external`` user)
  emits ``ext.chaos.tick`` events with a sequence number, one at a time; an event counts as
  published once JetStream acknowledged it (the SDK retries for up to 60 s meanwhile).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gantry.client.governance import GovernanceClient
from gantry.client.model_registry import ModelsClient
from gantry.client.serving import ServingClient
from gantry.client.specs import ColumnSpec
from gantry.core import GantryError
from gantry.supervisor.platform import Platform

MODEL = "chaos-probe"
DATASET = "chaos-data"
EVENT_TYPE = "ext.chaos.tick"
SOURCE = "chaos-probe"
COLUMNS = (
    ColumnSpec("id", "int64", "internal", nullable=False),
    ColumnSpec("email", "string", "pii"),
    ColumnSpec("value", "float64", "public"),
)
FEATURES = 4

Clock = Callable[[], float]


@dataclass(frozen=True)
class Call:
    """One call of a load: ``start`` and ``end`` in seconds on the bench's clock."""

    start: float
    end: float
    ok: bool
    error: str = ""


class Load:
    """A thread that calls something until stopped, keeping every :class:`Call`."""

    name = "load"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.calls: list[Call] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-{self.name}", daemon=True)

    def start(self) -> None:
        """Start calling."""
        self._thread.start()

    def stop(self, timeout_s: float = 90.0) -> None:
        """Stop after the call in flight."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def errors(self) -> int:
        """Calls that failed so far."""
        return sum(1 for c in self.calls if not c.ok)

    def _run(self) -> None:
        raise NotImplementedError

    def _paced(self, interval_s: float, once: Callable[[], None]) -> None:
        """Call ``once`` every ``interval_s`` (no catching up after a slow call) until stopped,
        recording how each went."""
        next_at = self.clock()
        while not self._stop.wait(max(0.0, next_at - self.clock())):
            next_at = max(next_at + interval_s, self.clock())
            start = self.clock()
            try:
                once()
            except GantryError as exc:
                self.calls.append(Call(start, self.clock(), False, _short(exc)))
            else:
                self.calls.append(Call(start, self.clock(), True))


class ServingLoad(Load):
    """Inference calls on the probe model (see the module)."""

    name = "serving"

    def __init__(
        self, platform: Platform, token: str, clock: Clock, *, interval_s: float, timeout_s: float
    ) -> None:
        super().__init__(clock)
        self.platform, self.token = platform, token
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.rows = np.random.default_rng(0).random((2, FEATURES), dtype=np.float32)
        self._client: ServingClient | None = None

    def _run(self) -> None:
        try:
            self._paced(self.interval_s, self._infer)
        finally:
            if self._client is not None:
                self._client.close()

    def _infer(self) -> None:
        address = self.platform.address("serving")  # Unavailable while it restarts
        if self._client is None or self._client.address != address:
            if self._client is not None:
                self._client.close()
            self._client = ServingClient(address, self.token, timeout_s=self.timeout_s)
        self._client.infer(MODEL, {"INPUT__0": self.rows})


class ReadLoad(Load):
    """Raw reads of the committed dataset version (see the module)."""

    name = "reads"

    def __init__(
        self,
        platform: Platform,
        token: str,
        clock: Clock,
        *,
        version: str,
        rows: int,
        interval_s: float,
    ) -> None:
        super().__init__(clock)
        self.platform, self.token = platform, token
        self.version, self.rows, self.interval_s = version, rows, interval_s
        self._client: GovernanceClient | None = None

    def _run(self) -> None:
        try:
            self._paced(self.interval_s, self._read)
        finally:
            if self._client is not None:
                self._client.close()

    def _read(self) -> None:
        address = self.platform.address("governance")
        if self._client is None or self._client.address != address:
            if self._client is not None:
                self._client.close()
            self._client = GovernanceClient(address, self.token, timeout_s=10, stream_timeout_s=20)
        table = self._client.read(DATASET, self.version, view="raw", purpose="chaos soak")
        if table.num_rows != self.rows:
            raise GantryError(f"read {table.num_rows} rows of {self.rows}")


class EventLoad(Load):
    """Signed outside events with a sequence number (see the module)."""

    name = "events"

    def __init__(
        self,
        platform: Platform,
        key_path: Path,
        clock: Clock,
        *,
        run_id: str,
        interval_s: float,
    ) -> None:
        super().__init__(clock)
        self.platform, self.key_path = platform, key_path
        self.run_id, self.interval_s = run_id, interval_s
        self.attempted: list[str] = []  #: every event id sent, acknowledged or not
        self.acked: dict[str, float] = {}  #: acknowledged event id -> when
        self.failure = ""  #: why the emitter could not run at all

    def _run(self) -> None:
        try:
            asyncio.run(self._emit())
        except GantryError as exc:
            self.failure = _short(exc)

    async def _emit(self) -> None:
        from gantry.client.emit import connect

        emitter = await connect(
            source=SOURCE,
            actor=f"svc-{SOURCE}",
            url=self.platform.nats_url,
            data_dir=self.platform.data_dir,
            key_path=self.key_path,
            connect_timeout_s=10,
        )
        async with emitter:
            seq = 0
            next_at = self.clock()
            while not self._stop.is_set():
                await asyncio.sleep(max(0.0, next_at - self.clock()))
                next_at = max(next_at + self.interval_s, self.clock())
                event = emitter.build(
                    EVENT_TYPE,
                    {"seq": seq, "run": self.run_id},
                    subject=f"tick-{seq}",
                    correlation_id=self.run_id,
                )
                seq += 1
                self.attempted.append(event.id)
                start = self.clock()
                try:
                    await emitter.publisher.publish(event)
                except GantryError as exc:  # JetStream did not ack within the retry window
                    self.calls.append(Call(start, self.clock(), False, _short(exc)))
                    continue
                self.acked[event.id] = self.clock()
                self.calls.append(Call(start, self.clock(), True))


def create_dataset(address: str, token: str, rows: int) -> str:
    """Create, upload and commit the dataset the reads use; its version id."""
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "email": [f"user{i}@example.com" for i in range(rows)],
            "value": [i / 7 for i in range(rows)],
        }
    )
    with GovernanceClient(address, token) as gov:
        gov.create_dataset(DATASET, columns=COLUMNS, description="read under chaos")
        upload = gov.upload_table(DATASET, table)
        return gov.commit(DATASET, [upload.upload_id], "chaos soak data").id


def deploy_model(governance: str, serving: str, token: str, work: Path) -> int:
    """Register a tiny MLP (4 -> 8 -> 2) and deploy it; its version."""
    import torch

    from gantry.training.export import export_model

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    artifact, fmt, signature = export_model(module, torch.zeros(2, FEATURES), work)
    with ModelsClient(governance, token) as registry:
        version = registry.register_model(
            MODEL,
            work / artifact,
            framework="pytorch",
            signature={**signature, "format": fmt},
            description="the chaos bench's probe",
        ).version
    with ServingClient(serving, token) as client:
        client.deploy(
            MODEL,
            version=version,
            max_batch_size=8,
            max_queue_delay_us=500,
            min_instances=1,
            max_instances=1,
        )
    return version


def wait_model_ready(platform: Platform, token: str, timeout_s: float) -> None:
    """Wait until serving answers an inference on the probe model (after its restart)."""
    deadline = time.monotonic() + timeout_s
    rows = np.zeros((1, FEATURES), dtype=np.float32)
    last: Any = None
    while time.monotonic() < deadline:
        try:
            with ServingClient(platform.address("serving"), token, timeout_s=2) as client:
                client.infer(MODEL, {"INPUT__0": rows})
            return
        except GantryError as exc:
            last = exc
        time.sleep(0.2)
    raise GantryError(f"{MODEL} did not answer within {timeout_s:.0f}s: {last}")


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


__all__ = [
    "DATASET",
    "EVENT_TYPE",
    "MODEL",
    "SOURCE",
    "Call",
    "EventLoad",
    "Load",
    "ReadLoad",
    "ServingLoad",
    "create_dataset",
    "deploy_model",
    "wait_model_ready",
]
