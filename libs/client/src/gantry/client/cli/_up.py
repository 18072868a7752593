"""``gantry up``: run NATS, the Gantry services and local node agents until Ctrl-C."""

from __future__ import annotations

import signal
import socket
import sys
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import EXIT_FAILED, DataDirOpt, command_settings, state_of
from gantry.supervisor.platform import (
    CONSOLE,
    DEFAULT_NATS_PORT,
    DEFAULT_SERVICES,
    Platform,
    local_agents,
)

#: Where ``gantry up`` serves the web console by default.
DEFAULT_CONSOLE_PORT = 8040


def up(
    ctx: typer.Context,
    data_dir: DataDirOpt = None,
    nats_port: Annotated[
        int, typer.Option("--nats-port", help="Preferred NATS port (0 = any free port).")
    ] = DEFAULT_NATS_PORT,
    agents: Annotated[
        int,
        typer.Option(
            "--agents",
            min=0,
            help="Local node agents to run, so jobs have somewhere to go (0 = none). One is "
            "named after this host and offers its CPUs, memory and CUDA GPUs (seen through "
            "torch); several are local-1..local-N and split the CPUs and memory between them.",
        ),
    ] = 1,
    agent_gpus: Annotated[
        int | None,
        typer.Option(
            "--agent-gpus",
            min=0,
            help="Declare this many GPUs on each agent instead (to try GPU jobs on a machine "
            "without them). Default: one agent detects the real ones; several declare none.",
            show_default=False,
        ),
    ] = None,
    agent_gpu_model: Annotated[
        str, typer.Option("--agent-gpu-model", help="Model of the declared GPUs.")
    ] = "A100",
    console_port: Annotated[
        int,
        typer.Option(
            "--console-port", min=0, max=65535, help="Port of the web console (0 = any free)."
        ),
    ] = DEFAULT_CONSOLE_PORT,
    no_console: Annotated[
        bool, typer.Option("--no-console", help="Do not run the web console.")
    ] = False,
) -> None:
    """Run NATS, the services, the web console and node agents until Ctrl-C.

    Agents (gantry.testing.agent) register over NATS and run placed workers on this machine.
    """
    settings = command_settings(ctx, data_dir)
    state = state_of(ctx)
    if not no_console and console_port and not _free(console_port):
        state.err.print(f"port {console_port} is taken: the web console takes a free port")
        console_port = 0
    platform = Platform(
        settings.data_dir,
        nats_port=nats_port,
        services=DEFAULT_SERVICES if no_console else (*DEFAULT_SERVICES, CONSOLE),
        agents=local_agents(agents, gpus=agent_gpus, gpu_model=agent_gpu_model),
        service_env={"GANTRY_CONSOLE__HTTP_PORT": str(console_port)},
    )

    def _interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        platform.start()
        _print_where(state.out, platform)
        dead = platform.wait()
        if dead is not None:
            print(
                f"gantry: error: {dead} exited unexpectedly; stopping the platform",
                file=sys.stderr,
            )
            code = EXIT_FAILED
    except KeyboardInterrupt:
        state.err.print("stopping Gantry…")
    finally:
        # A second Ctrl-C must not interrupt the orderly shutdown.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        try:
            platform.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if code:
        raise typer.Exit(code)
    state.err.print("Gantry stopped.")


def _free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be listened on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _print_where(out: Console, platform: Platform) -> None:
    table = Table(
        title=f"Gantry is up — data dir {escape(str(platform.data_dir))}", show_header=False
    )
    table.add_column("what", style="bold")
    table.add_column("where")
    table.add_row("NATS", platform.nats_url)
    for name in platform.services:
        info = platform.service_info(name)
        if name == CONSOLE:
            table.add_row("web console", escape(f"{info['http']}  (log in with a token)"))
            continue
        table.add_row(f"{name} gRPC", str(info.get("grpc", "")))
        if info.get("http"):
            table.add_row(f"{name} REST", f"{info['http']}/v2")
        if info.get("metrics"):
            table.add_row(f"{name} metrics", str(info["metrics"]))
    for agent in platform.agents:
        offers = (
            "this machine's CPUs and memory"
            if agent.cpus is None
            else (f"{agent.cpus:g} CPUs, {agent.memory} memory")
        )
        gpus = (
            "the CUDA GPUs it finds"
            if agent.gpus is None
            else (f"{agent.gpus} {agent.gpu_model} GPUs (declared)")
        )
        table.add_row("node agent", escape(f"{agent.node} in pool {agent.pool}: {offers}, {gpus}"))
    if platform.agents:
        table.add_row("see nodes", "gantry nodes list")
    table.add_row("admin token", escape(str(platform.data_dir / "admin.token")))
    out.print(table)
    out.print("Press Ctrl-C to stop.")
