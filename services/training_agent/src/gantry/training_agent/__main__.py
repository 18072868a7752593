"""``gantry-training-agent`` / ``python -m gantry.training_agent``: run the node agent."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gantry.core import GantryError, InvalidInput, configure_logging, load_settings
from gantry.sched.spec import parse_memory_mib
from gantry.training_agent.agent import NodeAgent
from gantry.training_agent.inventory import NodeInventory, advertise_address, declared_gpus
from gantry.training_agent.logs import SERVICE_NAME
from gantry.training_agent.settings import AgentSettings


async def serve(settings: AgentSettings, inventory: NodeInventory) -> None:
    """Run an agent until SIGTERM or SIGINT."""
    agent = NodeAgent(settings, inventory)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


# -- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m gantry.training_agent``."""
    p = argparse.ArgumentParser(
        prog="python -m gantry.training_agent",
        description="The Gantry node agent: registers this machine's GPUs (or CPU worker "
        "slots, or declared hardware) with the scheduler over NATS and runs the training "
        "workers placed on it. NATS, keys and storage come from GANTRY_NATS__URL, "
        "GANTRY_DATA_DIR and GANTRY_STORAGE__* like every Gantry service; the agent's own "
        "options are GANTRY_AGENT__* (docs/ops.md).",
    )
    p.add_argument("--node", default=socket.gethostname(), help="node name (default: hostname)")
    p.add_argument("--pool", default="default", help="node pool (default: default)")
    p.add_argument(
        "--gpus", type=int, help="declare this many GPUs (default: detect via NVML or torch)"
    )
    p.add_argument("--gpu-model", default="A100", help="model of declared GPUs (default A100)")
    p.add_argument("--gpu-memory", default="80Gi", help="memory per declared GPU (default 80Gi)")
    p.add_argument("--cpus", type=float, help="declare this many CPUs (default: detect)")
    p.add_argument("--memory", help="declare this much memory, e.g. 256Gi (default: detect)")
    p.add_argument("--rack", help="topology label rack=<RACK>")
    p.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a topology label"
    )
    p.add_argument("--heartbeat", type=float, help="seconds between heartbeats (default 5)")
    p.add_argument("--checkpoint-root", type=Path, help="default <data-dir>/checkpoints")
    p.add_argument("--data-dir", type=Path, help="keys live in <data-dir>/keys")
    return p


def inventory_from_args(args: argparse.Namespace) -> NodeInventory:
    """The inventory the command line declares, detected where it declares nothing."""
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"bad --label {item!r}", hint="write --label key=value")
        labels[key] = value
    if args.rack:
        labels["rack"] = args.rack
    inventory = NodeInventory.detect(args.node, args.pool, gpus=args.gpus is None, labels=labels)
    changes: dict[str, Any] = {}
    try:
        if args.gpus is not None:
            memory = parse_memory_mib(args.gpu_memory)
            changes["gpus"] = declared_gpus(args.gpus, args.gpu_model, memory)
        if args.memory is not None:
            changes["memory_mib"] = parse_memory_mib(args.memory)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if args.cpus is not None:
        changes["cpu_milli"] = int(args.cpus * 1000)
    return dataclasses.replace(inventory, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m gantry.training_agent``."""
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    agent: dict[str, Any] = {}
    if args.heartbeat is not None:
        agent["heartbeat_s"] = args.heartbeat
    if args.checkpoint_root is not None:
        agent["checkpoint_root"] = args.checkpoint_root
    try:
        inventory = inventory_from_args(args)  # a bad flag fails before anything starts
        settings = load_settings(AgentSettings, **overrides)
        if agent:  # flags win over GANTRY_AGENT__* for the options they name
            settings.agent = settings.agent.model_copy(update=agent)
        address = advertise_address(settings.nats.url, settings.agent.advertise_address)
        inventory = dataclasses.replace(inventory, address=address)
        configure_logging(SERVICE_NAME, level=settings.log_level, json=settings.log_json)
        asyncio.run(serve(settings, inventory))
    except GantryError as exc:
        print(f"gantry-training-agent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
