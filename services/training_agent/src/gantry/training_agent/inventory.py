"""What a node offers, and how busy it is.

GPUs are found through NVML (``nvidia-ml-py``: model, memory, NUMA node, NVLink peers) and,
where NVML is missing, through torch's CUDA view. A node with no GPU offers CPU worker slots
and says so (``worker_slots="cpu"`` in its registration). :class:`UsageSampler` reads the
utilisation sent with every heartbeat: CPU from ``/proc/stat``, memory from
``/proc/meminfo``, and per GPU utilisation, memory, temperature, power and throttling from
NVML.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import socket
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gantry.core import get_logger
from gantry.events.catalog import GpuDevice, GpuUsage, NodeRegistered

#: This process's boot id: a re-registration with another one tells the scheduler that the
#: agent restarted and the workers it ran are gone.
BOOT_ID = uuid.uuid4().hex[:12]
AGENT_NAME = "gantry.training_agent"
_log = get_logger("gantry.training_agent")


@dataclass(frozen=True, kw_only=True)
class NodeInventory:
    """What a node offers the scheduler: CPUs, memory, GPUs and topology labels."""

    node: str
    pool: str = "default"
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuDevice, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    address: str = ""
    detected_gpus: bool = False
    """Whether ``gpus`` are real devices found here (False: declared, or none)."""

    @property
    def worker_slots(self) -> str:
        """``gpu`` when the node has GPUs, ``cpu`` when workers run on CPU slots."""
        return "gpu" if self.gpus else "cpu"

    @classmethod
    def detect(
        cls,
        node: str,
        pool: str = "default",
        *,
        gpus: bool = True,
        labels: Mapping[str, str] | None = None,
        address: str = "",
    ) -> NodeInventory:
        """This machine's real CPUs, memory and GPUs (``gpus=False`` skips GPU detection)."""
        found = detect_gpus() if gpus else ()
        merged = dict(labels or {})
        domains = {d.nvlink_domain for d in found if d.nvlink_domain}
        if domains and "nvlink" not in merged:
            merged["nvlink"] = "yes"
        return cls(
            node=node,
            pool=pool,
            cpu_milli=cpu_count() * 1000,
            memory_mib=memory_mib(),
            gpus=found,
            labels=merged,
            address=address,
            detected_gpus=bool(found),
        )

    def describe(self) -> str:
        """One line for the log: what the node offers."""
        if self.gpus:
            models = sorted({g.model for g in self.gpus})
            return f"{len(self.gpus)} GPU(s) ({', '.join(models)})"
        return (
            f"no GPU found: offering {self.cpu_milli // 1000} CPU worker slot(s) "
            f"({self.memory_mib} MiB memory); workers train on CPU with gloo"
        )

    def to_event(self, *, heartbeat_s: float) -> NodeRegistered:
        """The registration event for this inventory."""
        return NodeRegistered(
            node=self.node,
            pool=self.pool,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpus=list(self.gpus),
            labels=dict(self.labels),
            heartbeat_s=heartbeat_s,
            agent=f"{AGENT_NAME}/{BOOT_ID}",
            address=self.address,
            worker_slots=self.worker_slots,
        )


def declared_gpus(count: int, model: str, memory_mib: int) -> tuple[GpuDevice, ...]:
    """``count`` identical GPUs, for nodes that declare hardware they do not have."""
    return tuple(GpuDevice(index=i, model=model, memory_mib=memory_mib) for i in range(count))


# -- NVML -------------------------------------------------------------------------------------


def _nvml() -> Any | None:
    """The initialised ``pynvml`` module, or None where NVML (or its driver) is missing."""
    if importlib.util.find_spec("pynvml") is None:
        return None
    nvml: Any = importlib.import_module("pynvml")
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA GPU here
        return None
    return nvml


def detect_gpus() -> tuple[GpuDevice, ...]:
    """The node's GPUs: NVML first (with NUMA and NVLink), else torch's CUDA view."""
    nvml = _nvml()
    if nvml is not None:
        try:
            return _nvml_gpus(nvml)
        except Exception as exc:  # a driver hiccup must not stop the agent: try torch
            _log.warning("NVML could not list the GPUs", error=str(exc))
    return detect_cuda_gpus()


def _nvml_gpus(nvml: Any) -> tuple[GpuDevice, ...]:
    devices = []
    count = int(nvml.nvmlDeviceGetCount())
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        memory = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) >> 20
        numa = _numa_node(nvml, handle)
        devices.append(
            GpuDevice(
                index=index,
                model=name,
                memory_mib=memory,
                numa=numa,
                nvlink_domain=_nvlink_domain(nvml, handle),
            )
        )
    return tuple(devices)


def _numa_node(nvml: Any, handle: Any) -> int:
    with contextlib.suppress(Exception):
        bus = nvml.nvmlDeviceGetPciInfo(handle).busId
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
        path = Path("/sys/bus/pci/devices") / bus.lower()[-12:] / "numa_node"
        return int(path.read_text().strip())
    return -1


def _nvlink_domain(nvml: Any, handle: Any) -> str:
    """A name shared by GPUs joined by NVLink: the sorted bus ids of the active links' peers
    and the GPU itself; "" where there is no active link."""
    peers = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            bus = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
        except Exception:  # NotSupported (no NVLink) or no such link
            break
        peers.append(bus.decode() if isinstance(bus, bytes) else str(bus))
    if not peers:
        return ""
    with contextlib.suppress(Exception):
        own = nvml.nvmlDeviceGetPciInfo(handle).busId
        peers.append(own.decode() if isinstance(own, bytes) else str(own))
    return f"nvl-{zlib.crc32(','.join(sorted(set(peers))).encode()):08x}"


def detect_cuda_gpus() -> tuple[GpuDevice, ...]:
    """The CUDA GPUs torch sees here; none when torch is missing or CUDA unavailable."""
    if importlib.util.find_spec("torch") is None:
        return ()
    torch: Any = importlib.import_module("torch")  # untyped on purpose: mypy need not read it
    if not torch.cuda.is_available():
        return ()
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            GpuDevice(index=index, model=str(props.name), memory_mib=int(props.total_memory) >> 20)
        )
    return tuple(devices)


# -- the machine ------------------------------------------------------------------------------


def cpu_count() -> int:
    """CPUs this process may use (containers, taskset)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def memory_mib() -> int:
    """Total memory of the machine."""
    info = _meminfo()
    if "MemTotal" in info:
        return info["MemTotal"] >> 10
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) >> 20


def _meminfo() -> dict[str, int]:
    out = {}
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0])  # kB
    return out


def advertise_address(nats_url: str, configured: str = "") -> str:
    """Where other nodes reach this one: ``configured``, else the local address of the route
    to the NATS server (loopback when NATS runs here)."""
    if configured:
        return configured
    host = urlsplit(nats_url.split(",")[0]).hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 4222))  # UDP: no packet is sent, only a route chosen
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


class UsageSampler:
    """CPU, memory and GPU utilisation since the previous sample."""

    def __init__(self) -> None:
        self._nvml = _nvml()
        self._last_cpu = _cpu_times()
        self._last_net = (time.monotonic(), *_net_bytes())

    def network(self) -> dict[str, float]:
        """Bytes per second received and sent on the node's interfaces (loopback excluded)
        since the last call: ``net_rx_bytes_per_s`` and ``net_tx_bytes_per_s``."""
        now, rx, tx = time.monotonic(), *_net_bytes()
        then, rx0, tx0 = self._last_net
        self._last_net = (now, rx, tx)
        elapsed = now - then
        if elapsed <= 0:
            return {"net_rx_bytes_per_s": 0.0, "net_tx_bytes_per_s": 0.0}
        return {
            "net_rx_bytes_per_s": max(0.0, (rx - rx0) / elapsed),
            "net_tx_bytes_per_s": max(0.0, (tx - tx0) / elapsed),
        }

    def cpu_util(self) -> float:
        """Busy fraction of all CPUs since the last call."""
        now = _cpu_times()
        (busy0, total0), (busy1, total1) = self._last_cpu, now
        self._last_cpu = now
        if total1 <= total0:
            return 0.0
        return max(0.0, min(1.0, (busy1 - busy0) / (total1 - total0)))

    def memory_used_mib(self) -> int:
        """Memory in use (total minus available)."""
        info = _meminfo()
        if "MemTotal" in info and "MemAvailable" in info:
            return (info["MemTotal"] - info["MemAvailable"]) >> 10
        return 0

    def gpus(self) -> list[GpuUsage]:
        """Per-GPU utilisation from NVML; empty without NVML."""
        nvml = self._nvml
        if nvml is None:
            return []
        out = []
        try:
            for index in range(int(nvml.nvmlDeviceGetCount())):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                temperature = power = 0.0
                throttled = False
                with contextlib.suppress(Exception):
                    temperature = float(
                        nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                    )
                with contextlib.suppress(Exception):
                    power = float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0
                with contextlib.suppress(Exception):
                    reasons = int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
                    # thermal and hardware slowdowns: a GPU at its power cap under load is
                    # working as designed, not degraded
                    slow = (
                        getattr(nvml, "nvmlClocksThrottleReasonHwSlowdown", 0)
                        | getattr(nvml, "nvmlClocksThrottleReasonSwThermalSlowdown", 0)
                        | getattr(nvml, "nvmlClocksThrottleReasonHwThermalSlowdown", 0)
                    )
                    throttled = bool(reasons & slow)
                out.append(
                    GpuUsage(
                        index=index,
                        util=min(1.0, float(util.gpu) / 100.0),
                        memory_used_mib=int(memory.used) >> 20,
                        temperature_c=temperature,
                        power_w=power,
                        throttled=throttled,
                    )
                )
        except Exception as exc:  # a driver hiccup: report no GPU figures this time
            _log.warning("NVML utilisation unavailable", error=str(exc))
            return []
        return out


def _net_bytes() -> tuple[int, int]:
    """Bytes received and sent so far on every interface but loopback (``/proc/net/dev``)."""
    rx = tx = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                continue
            fields = counters.split()
            rx += int(fields[0])
            tx += int(fields[8])
    return rx, tx


def _cpu_times() -> tuple[int, int]:
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        total = sum(fields[:8])
        return total - idle, total
    return 0, 0


__all__ = [
    "AGENT_NAME",
    "BOOT_ID",
    "NodeInventory",
    "UsageSampler",
    "advertise_address",
    "cpu_count",
    "declared_gpus",
    "detect_cuda_gpus",
    "detect_gpus",
    "memory_mib",
]
