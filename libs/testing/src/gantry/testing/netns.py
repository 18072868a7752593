"""Separate hosts on one machine: Linux network namespaces joined by a bridge (``ip netns``,
veth; needs root and iproute2).

Each :class:`Host` is a namespace with its own address on ``10.<n>.0.0/24``; the machine itself
is ``.1`` on the bridge, so processes left outside (the platform's services) reach every host
and every host reaches them. :meth:`Network.cut` takes a host off the network (its link goes
down) and :meth:`Network.heal` puts it back: a network partition, as opposed to a crash.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, or refused)."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if result.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {result.stderr.strip() or result.stdout}")


def netns_unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    probe = f"gtprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", probe)
    except NetnsUnavailable as exc:
        return f"cannot create a network namespace: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return None


@dataclass(frozen=True)
class Host:
    """One namespace: its name, address and the bridge-side end of its link."""

    name: str
    netns: str
    address: str
    link: str


class Network:
    """A bridge and hosts in namespaces; :meth:`close` removes them all."""

    def __init__(self, host_names: list[str], *, subnet: int = 77) -> None:
        tag = uuid.uuid4().hex[:5]
        self.prefix = f"10.{subnet}.0"
        self.gateway = f"{self.prefix}.1"
        self.bridge = f"gbr{tag}"
        self.hosts: dict[str, Host] = {}
        try:
            _ip("link", "add", "name", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(host_names):
                self._add(name, tag, i)
        except BaseException:
            self.close()
            raise

    def _add(self, name: str, tag: str, index: int) -> None:
        netns = f"g{tag}{name}"[:15]
        inner, outer = f"gi{tag}{index}", f"go{tag}{index}"
        address = f"{self.prefix}.{10 + index}"
        _ip("netns", "add", netns)
        self.hosts[name] = Host(name, netns, address, outer)
        _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
        _ip("link", "set", inner, "netns", netns)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("netns", "exec", netns, "ip", "addr", "add", f"{address}/24", "dev", inner)
        _ip("netns", "exec", netns, "ip", "link", "set", inner, "up")
        _ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")

    def cut(self, name: str) -> None:
        """Take host ``name`` off the network (nothing reaches it, it reaches nothing)."""
        _ip("link", "set", self.hosts[name].link, "down")

    def heal(self, name: str) -> None:
        """Put host ``name`` back on the network."""
        _ip("link", "set", self.hosts[name].link, "up")

    def close(self) -> None:
        """Remove every namespace, link and the bridge (processes inside must be gone)."""
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10)
        self.hosts.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Host", "NetnsUnavailable", "Network", "netns_unavailable_reason"]
