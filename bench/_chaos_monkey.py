"""The chaos bench's monkey: a seeded schedule of SIGKILLs, one target down at a time.

Every ``every_s`` seconds the monkey draws a kind (service, node agent or NATS server, each
equally likely), then one target of that kind, and a pause of 1-3 s, all from one
``random.Random(seed)``: the same seed gives the same targets and pauses in the same order (the
times differ with how long each restart takes). It SIGKILLs the target, waits the pause, starts
it again and waits until it is *ready*:

- a service: its run file names the new process and its gRPC health check says SERVING
  (:meth:`Platform.restart_service`), plus any extra probe given for it (the bench waits for
  serving's deployment to be loaded again);
- a node agent: it logged that it registered its node;
- a NATS server: it logged "Server is ready", and then every stream has a leader and all three
  replicas current again, asked of the cluster as the admin user, so the next kill never takes
  a second replica of a stream that is still catching up (R3 tolerates one server down).

Each :class:`Kill` keeps when the SIGKILL was sent and when the target was ready. The next kill
comes ``every_s`` after the previous one, but never sooner than ``every_s / 2`` after the
target was ready: restarts here take 3-10 s, and without that gap the kill windows would cover
the whole run and leave no time "outside" them to measure. A restart that fails is tried again
(3 tries); a target that cannot be brought back stops the chaos and is reported.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import nats
import nats.errors

from gantry.core import GantryError, Unavailable
from gantry.supervisor.nats_cluster import NatsCluster
from gantry.supervisor.nats_server import NatsServer
from gantry.supervisor.platform import Platform

Kind = Literal["service", "agent", "nats"]
KINDS: tuple[Kind, ...] = ("service", "agent", "nats")
RESTART_TRIES = 3
#: How long a NATS server may take to catch its stream replicas up after a restart.
NATS_SETTLE_S = 60.0


@dataclass(frozen=True)
class Target:
    """Something the monkey kills: a service, an agent (``agent-<node>``) or ``nats-<i>``."""

    name: str
    kind: Kind


@dataclass
class Kill:
    """One kill: times are seconds on the bench's clock."""

    target: Target
    at: float  #: SIGKILL sent
    pause_s: float  #: drawn pause before the restart
    restart_at: float = math.nan  #: restart begun (the last try)
    ready_at: float = math.nan  #: the target was ready again (nan: never)
    tries: int = 0
    error: str = ""  #: the last restart failure, if any

    @property
    def down_s(self) -> float:
        """From the SIGKILL until the target was ready again."""
        return self.ready_at - self.at

    def window(self, before_s: float, grace_s: float) -> tuple[float, float]:
        """``[at - before_s, ready_at + grace_s]`` (open-ended when it never came back)."""
        end = self.ready_at if not math.isnan(self.ready_at) else math.inf
        return self.at - before_s, end + grace_s


def targets_of(platform: Platform, cluster: NatsCluster) -> list[Target]:
    """Every service and agent of ``platform`` and every server of ``cluster``."""
    return (
        [Target(name, "service") for name in platform.services]
        + [Target(agent.name, "agent") for agent in platform.agents]
        + [Target(f"nats-{i + 1}", "nats") for i in range(len(cluster.servers))]
    )


class Monkey:
    """Kills and restarts targets on a seeded schedule in a thread of its own (see the module).

    ``clock`` gives the bench's seconds; ``say`` receives one line per kill; ``probes`` maps a
    target name to an extra readiness wait run after its restart (it raises on a timeout).
    """

    def __init__(
        self,
        platform: Platform,
        cluster: NatsCluster,
        targets: Sequence[Target],
        *,
        seed: int,
        every_s: float,
        pause_s: tuple[float, float],
        clock: Callable[[], float],
        say: Callable[[str], None],
        probes: Mapping[str, Callable[[], None]] | None = None,
    ) -> None:
        self.platform = platform
        self.cluster = cluster
        self.targets = list(targets)
        self.rng = random.Random(seed)
        self.every_s = every_s
        self.pause_s = pause_s
        self.clock = clock
        self.say = say
        self.probes = dict(probes or {})
        self.kills: list[Kill] = []
        self.failed: Kill | None = None  #: a target that could not be brought back
        self.error = ""  #: what stopped the monkey itself, if anything did
        self.until = math.inf
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-monkey", daemon=True)

    def start(self, until: float) -> None:
        """Kill until ``until`` on the bench's clock (the first kill one period from now)."""
        self.until = until
        self._thread.start()

    def stop(self) -> None:
        """No new kill; wait until the current target (if any) is back."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def down(self) -> Kill | None:
        """The kill in progress (its target not ready yet), if any."""
        last = self.kills[-1] if self.kills else None
        return last if last is not None and math.isnan(last.ready_at) else None

    @property
    def stopped(self) -> bool:
        """Whether the chaos ended early: a target stayed down, or the monkey failed."""
        return self.failed is not None or bool(self.error)

    def _run(self) -> None:
        try:
            self._kill_loop()
        except Exception as exc:  # a bug or a platform call that broke: the bench reports it
            self.error = f"{type(exc).__name__}: {exc}"

    def _kill_loop(self) -> None:
        next_at = self.clock() + self.every_s
        while not self._stop.wait(max(0.0, next_at - self.clock())):
            if self.clock() >= self.until:
                return
            kind = self.rng.choice(KINDS)
            target = self.rng.choice([t for t in self.targets if t.kind == kind])
            pause = round(self.rng.uniform(*self.pause_s), 2)
            kill = Kill(target, self.clock(), pause)
            self.kills.append(kill)
            self._kill(target)
            time.sleep(pause)  # not cut short by stop(): the target must come back first
            if not self._bring_back(kill):
                self.failed = kill
                return
            self.say(
                f"killed {target.name} ({target.kind}) at {kill.at:.1f}s; ready again after "
                f"{kill.down_s:.1f}s" + (f" ({kill.tries} tries)" if kill.tries > 1 else "")
            )
            next_at = max(kill.at + self.every_s, self.clock() + self.every_s / 2)

    def _kill(self, target: Target) -> None:
        if target.kind == "nats":
            self._server(target).kill()
        else:
            self.platform.kill_service(target.name)

    def _bring_back(self, kill: Kill) -> bool:
        target = kill.target
        for attempt in range(1, RESTART_TRIES + 1):
            kill.tries, kill.restart_at = attempt, self.clock()
            try:
                if target.kind == "nats":
                    server = self._server(target)
                    if not server.running:
                        server.start(timeout_s=30)
                    wait_streams_current(self.platform.nats_url_for(), NATS_SETTLE_S)
                else:
                    if self.platform.pid(target.name) is None:
                        self.platform.restart_service(target.name, timeout_s=120)
                    probe = self.probes.get(target.name)
                    if probe is not None:
                        probe()
            except (GantryError, OSError) as exc:
                kill.error = f"{type(exc).__name__}: {exc}"
                self.say(f"[red]restart of {target.name} failed (try {attempt}):[/] {exc}")
                time.sleep(2.0)
                continue
            kill.ready_at = self.clock()
            return True
        return False

    def _server(self, target: Target) -> NatsServer:
        return self.cluster.servers[int(target.name.removeprefix("nats-")) - 1]


def wait_streams_current(url: str, timeout_s: float) -> None:
    """Wait until every stream has a leader and every replica is current (admin ``url``)."""
    deadline = time.monotonic() + timeout_s
    lagging = ["no answer yet"]
    while time.monotonic() < deadline:
        lagging = asyncio.run(_lagging(url))
        if not lagging:
            return
        time.sleep(0.5)
    raise Unavailable(
        f"the NATS cluster's streams did not catch up in {timeout_s:.0f}s: "
        + "; ".join(lagging[:5])
    )


async def _quiet(exc: Exception) -> None:
    return None  # a server being down is what the bench expects; no log lines for it


async def _nothing() -> None:
    return None


async def _lagging(url: str) -> list[str]:
    """What keeps the cluster from full redundancy: streams without a leader or with a replica
    that is not current (["..."] when no server answers)."""
    try:
        nc = await nats.connect(
            servers=url.split(","),
            connect_timeout=2,
            max_reconnect_attempts=1,
            error_cb=_quiet,
            disconnected_cb=_nothing,
            reconnected_cb=_nothing,
        )
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        return [f"no server answered: {exc!r}"]
    try:
        out = []
        for info in await nc.jetstream(timeout=2).streams_info():
            name, cluster = info.config.name, info.cluster
            if cluster is None:
                continue
            if not cluster.leader:
                out.append(f"{name}: no leader")
            for peer in cluster.replicas or []:
                if peer.offline or not peer.current:
                    out.append(f"{name}: replica {peer.name} behind by {peer.lag or 0}")
        return out
    except (nats.errors.Error, TimeoutError) as exc:
        return [f"stream info failed: {exc!r}"]
    finally:
        await nc.close()


__all__ = ["KINDS", "Kill", "Kind", "Monkey", "Target", "targets_of", "wait_streams_current"]
