"""``gantry up``: run NATS and the Gantry services in the foreground until Ctrl-C."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import EXIT_FAILED, DataDirOpt, command_settings, state_of
from gantry.supervisor.platform import DEFAULT_NATS_PORT, Platform


def up(
    ctx: typer.Context,
    data_dir: DataDirOpt = None,
    nats_port: Annotated[
        int, typer.Option("--nats-port", help="Preferred NATS port (0 = any free port).")
    ] = DEFAULT_NATS_PORT,
) -> None:
    """Run NATS and the Gantry services in the foreground until Ctrl-C."""
    settings = command_settings(ctx, data_dir)
    state = state_of(ctx)
    platform = Platform(settings.data_dir, nats_port=nats_port)

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


def _print_where(out: Console, platform: Platform) -> None:
    table = Table(
        title=f"Gantry is up — data dir {escape(str(platform.data_dir))}", show_header=False
    )
    table.add_column("what", style="bold")
    table.add_column("where")
    table.add_row("NATS", platform.nats_url)
    for name in platform.services:
        info = platform.service_info(name)
        table.add_row(f"{name} gRPC", str(info.get("grpc", "")))
        if info.get("metrics"):
            table.add_row(f"{name} metrics", str(info["metrics"]))
    table.add_row("admin token", escape(str(platform.data_dir / "admin.token")))
    out.print(table)
    out.print("Press Ctrl-C to stop.")
