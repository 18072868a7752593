"""Several hosts and a NATS cluster: three nats-servers (JetStream R3, every write fsynced, the
per-service users) and two node agents, each on a host of its own — a Linux network namespace
on this machine — with the services on the machine itself.

Mid-run one NATS server is killed and the node running a training job is cut off the network.
The platform keeps going: the job is requeued on the other node and resumes from its
checkpoint, and every event NATS acknowledged is still in its stream and in the audit log.

Where network namespaces cannot be made (not root, no iproute2), the test says so and runs the
same scenario on loopback ports, the cut-off node's agent frozen (SIGSTOP) instead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gantry.client.admin import create_service_account, create_token
from gantry.client.audit import AuditClient, Filter
from gantry.client.emit import connect
from gantry.client.scheduler import SchedulerClient
from gantry.core import NatsSettings
from gantry.events import Bus
from gantry.events.nats_auth import ensure_credentials, password_of
from gantry.supervisor.nats_cluster import NatsCluster
from gantry.supervisor.platform import DEFAULT_SERVICES, ExternalNats, LocalAgent, Platform
from gantry.testing.netns import Network, netns_unavailable_reason
from gantry.testing.trainers import counting_trainer

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]

NODES = ("node-a", "node-b")

TRAIN = counting_trainer(steps_after_resume=5, step_s=0.2)


def _job_yaml() -> str:
    argv = json.dumps([sys.executable, "-c", TRAIN])
    return (
        "apiVersion: gantry/v1\nkind: TrainingJob\n"
        "metadata: {name: partitioned, queue: default}\n"
        "spec:\n"
        "  resources: {gpus: 0, cpus: 1, memory: 512Mi}\n"
        f"  entrypoint: {{command: {argv}}}\n"
        "  training: {checkpointInterval: 1}\n"
    )


@dataclass
class Site:
    platform: Platform
    cluster: NatsCluster
    network: Network | None
    credentials: dict[str, str]
    mode: str
    logs: list[str] = field(default_factory=list)

    def cut(self, node: str) -> None:
        """Take ``node`` off the network (or, on loopback, freeze its agent)."""
        if self.network is not None:
            self.network.cut(node)
        else:
            pid = self.platform.pid(f"agent-{node}")
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)

    def heal(self, node: str) -> None:
        if self.network is not None:
            self.network.heal(node)
        else:
            pid = self.platform.pid(f"agent-{node}")
            if pid is not None:
                os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("multihost")
    creds = ensure_credentials(root / "credentials.env")
    reason = netns_unavailable_reason()
    network: Network | None = None
    if reason is None:
        network = Network(["nats1", "nats2", "nats3", *NODES])
        servers = [network.hosts[n] for n in ("nats1", "nats2", "nats3")]
        cluster = NatsCluster(
            root / "nats",
            creds,
            hosts=[h.address for h in servers],
            netns=[h.netns for h in servers],
        )
        service_host = network.gateway
        mode = "network namespaces"
    else:
        warnings.warn(
            f"network namespaces cannot be made here ({reason}); running the multi-host "
            "scenario on loopback ports instead",
            stacklevel=1,
        )
        cluster = NatsCluster(root / "nats", creds)
        service_host = "127.0.0.1"
        mode = f"loopback ({reason})"
    logs: list[str] = []
    platform = Platform(
        root / "data",
        nats=ExternalNats(url=cluster.url, credentials=creds, stream_replicas=3),
        agents=[
            LocalAgent(
                node=node,
                cpus=2,
                memory="2Gi",
                gpus=0,
                heartbeat_s=0.5,
                netns=network.hosts[node].netns if network else None,
            )
            for node in NODES
        ],
        service_env={
            **{f"GANTRY_{s.upper()}__GRPC_HOST": service_host for s in DEFAULT_SERVICES},
            "GANTRY_SCHEDULER__HEARTBEAT_TIMEOUT_S": "3",
            "GANTRY_AGENT__FENCE_AFTER_S": "2",  # below the scheduler's timeout, as it must be
        },
        log_sink=logs.append,
    )
    try:
        cluster.start(timeout_s=60)
        platform.start(timeout_s=180)
        yield Site(platform, cluster, network, creds, mode, logs)
    finally:
        platform.stop()
        cluster.stop()
        if network is not None:
            network.close()


class Ticker:
    """An outside service emitting numbered events all along; remembers every acked id."""

    def __init__(self, platform: Platform, key_path: Path) -> None:
        self.platform = platform
        self.key_path = key_path
        self.acked: list[str] = []
        self.acked_at: list[float] = []
        self.failures = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:
            self.error = exc

    async def _run(self) -> None:
        async with await connect(
            source="ticker",
            actor="svc-ticker",
            url=self.platform.nats_url,
            data_dir=self.platform.data_dir,
            key_path=self.key_path,
        ) as emitter:
            n = 0
            while not self._stop.is_set():
                n += 1
                event = emitter.build("ext.ticker.tick", {"n": n})
                try:
                    await emitter.publisher.publish(event)
                    self.acked.append(str(event.id))
                    self.acked_at.append(time.monotonic())
                except Exception:
                    self.failures += 1
                await asyncio.sleep(0.05)

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


async def _stored_ids(url: str, password: str, count: int) -> set[str]:
    """The event ids in the EXTERNAL stream (read as admin)."""
    bus = await Bus.connect(NatsSettings(url=url, user="admin", password=password), name="check")
    try:
        sub = await bus.js.pull_subscribe("ext.ticker.>", stream="EXTERNAL")
        ids: set[str] = set()
        while True:
            try:
                msgs = await sub.fetch(500, timeout=2)
            except Exception:
                break
            for m in msgs:
                ids.add((m.headers or {}).get("Nats-Msg-Id", ""))
                await m.ack()
            if len(ids) >= count and len(msgs) < 500:
                break
        return ids
    finally:
        await bus.close()


def test_a_lost_nats_server_and_a_cut_off_node_lose_nothing(site: Site) -> None:
    platform = site.platform
    data = platform.data_dir
    admin = create_token(data, "ops", ["platform-admin"], dt.timedelta(hours=1))
    _token, key_path = create_service_account(data, "ticker")
    with (
        SchedulerClient(platform.address("scheduler"), admin) as sched,
        Ticker(platform, key_path) as ticker,
    ):
        job = sched.submit(_job_yaml()).job
        deadline = time.monotonic() + 60
        while (job := sched.get(job.id)).state != "running":
            assert time.monotonic() < deadline, f"never ran: {job.state}"
            time.sleep(0.2)
        (victim,) = {p.node for p in job.placements}
        (other,) = [n for n in NODES if n != victim]
        marker = data / "workers" / "checkpoints" / job.id / "step"
        alt = data / "checkpoints" / job.id / "step"
        deadline = time.monotonic() + 60
        while True:
            found = marker if marker.exists() else alt
            if found.exists() and int(found.read_text() or 0) >= 5:
                break
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.1)

        storm = time.monotonic()
        site.cluster.servers[1].kill()  # one of three NATS servers dies
        site.cut(victim)  # and the job's node drops off the network
        try:
            deadline = time.monotonic() + 90
            while True:
                job = sched.get(job.id)
                if job.attempt >= 2 and job.state == "succeeded":
                    break
                assert job.state not in ("failed", "cancelled"), (job.state, job.message)
                if time.monotonic() > deadline:
                    nodes = [(n.name, n.state) for n in sched.nodes()]
                    tail = "\n".join(ln for ln in site.logs if "scheduler" in ln[:20])[-4000:]
                    pytest.fail(f"not resumed: {job.state} {job.attempt} {nodes}\n{tail}")
                time.sleep(0.3)
            assert {p.node for p in job.placements} == {other}
            deadline = time.monotonic() + 30
            while True:  # log lines travel apart from the job's state
                with sched.logs(job.id) as stream:
                    lines = [ln for ln in stream if "resumed from step" in ln.text]
                if lines or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert lines and all(ln.node == other for ln in lines), lines
            assert int(lines[-1].text.rsplit(" ", 1)[1]) >= 5  # from the checkpoint, not 0
            if site.network is not None:  # a cut-off (not frozen) agent stops its workers
                fenced = [ln for ln in site.logs if victim in ln and "cut off from the" in ln]
                assert fenced, f"agent-{victim} did not stop its workers when cut off"
        finally:
            site.heal(victim)
        time.sleep(1.0)  # a last few ticks after the storm

    assert ticker.error is None, repr(ticker.error)
    # the outside service kept publishing before and after the storm (how many depends on load)
    before = sum(1 for t in ticker.acked_at if t < storm)
    after = len(ticker.acked_at) - before
    assert before > 0 and after > 0, (before, after, ticker.failures)
    stored = asyncio.run(
        _stored_ids(platform.nats_url, password_of(site.credentials, "admin"), len(ticker.acked))
    )
    lost = set(ticker.acked) - stored
    assert not lost, f"{len(lost)} acknowledged events lost ({site.mode})"
    with AuditClient(platform.address("audit"), admin) as audit:
        deadline = time.monotonic() + 60
        while True:
            audited = {r.event_id for r in audit.query(Filter(types=["ext.ticker.tick"]))}
            if set(ticker.acked) <= audited or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert set(ticker.acked) <= audited, f"{len(set(ticker.acked) - audited)} not audited"
    print(f"multi-host ({site.mode}): {len(ticker.acked)} events acked, none lost")
