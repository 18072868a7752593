"""The ``gantry`` command line: run the platform, administer it, emit events, audit, govern data.

::

    gantry up [--data-dir .gantry] [--nats-port 4222]
    gantry sim --nodes nodes.csv --jobs jobs.csv [--policies fifo,sjf-oracle,gantry]
    gantry admin init | token create | service-account create
    gantry events emit TYPE --data '{...}' --source S --actor A
    gantry audit query | export | report | verify | proof
    gantry data create | list | show | upload | commit | log | diff | rollback
    gantry data read | download | grant | lineage | policy show | policy set
    gantry data subject find | erase | erasures
    gantry models list | show | register | download
    gantry serve deploy | status | list | traffic | promote | rollback | undeploy
    gantry serve infer | generate
    gantry profile job | nodes | mark | trace | traces
    gantry pipelines submit | list | get | delete | run
    gantry pipelines runs list | get | cancel | retry
    gantry experiments submit | list | get | cancel
    gantry sessions start | list | get | stop | resume

Settings (``GANTRY_DATA_DIR``, ``GANTRY_TOKEN``, ``GANTRY_AUDIT_ADDR``,
``GANTRY_GOVERNANCE_ADDR``) are loaded once in :func:`main` and handed to every command;
``--data-dir`` and ``--token`` override them. Every error Gantry raises on purpose is printed as
``gantry: error: <message>`` with exit status 2.

This module holds the root app and the entry point; each command group lives in a module of its
own (``_up``, ``_admin``, ``_events``, ``_audit``, ``_audit_verify``, ``_data``,
``_data_access``, ``_data_subjects``, ``_models``, ``_jobs``, ``_serve``, ``_profile``,
``_pipelines``, ``_experiments``, ``_sessions``) and what they share in ``_common`` (and
``_following``: how a command follows a run, an experiment or a session until it ends). The
names in ``__all__`` are the package's public surface.
"""

from __future__ import annotations

import sys

import typer

from gantry.client.cli._admin import admin_app
from gantry.client.cli._audit import DecisionChoice, ExportFormat, access_table, audit_app
from gantry.client.cli._common import (
    AUDIT_KEY_ID,
    EXIT_ERROR,
    EXIT_FAILED,
    GantryGroup,
    State,
    audit_trust,
    configure_cli_logging,
    parse_time,
    print_error,
)
from gantry.client.cli._data import data_app
from gantry.client.cli._events import events_app
from gantry.client.cli._experiments import experiments_app
from gantry.client.cli._jobs import jobs_app, nodes_app, queues_app, usage
from gantry.client.cli._models import models_app
from gantry.client.cli._pipelines import pipelines_app
from gantry.client.cli._profile import profile_app
from gantry.client.cli._serve import serve_app
from gantry.client.cli._sessions import sessions_app
from gantry.client.cli._sim import sim
from gantry.client.cli._up import up
from gantry.client.config import ClientSettings
from gantry.core import GantryError, load_settings

app = typer.Typer(
    cls=GantryGroup,
    name="gantry",
    help="Gantry: run the platform, administer it, emit events, audit, and govern data and models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("up")(up)
app.command("sim")(sim)
app.add_typer(admin_app, name="admin")
app.add_typer(events_app, name="events")
app.add_typer(audit_app, name="audit")
app.add_typer(data_app, name="data")
app.add_typer(models_app, name="models")
app.add_typer(serve_app, name="serve")
app.add_typer(profile_app, name="profile")
app.add_typer(pipelines_app, name="pipelines")
app.add_typer(experiments_app, name="experiments")
app.add_typer(sessions_app, name="sessions")
app.add_typer(jobs_app, name="jobs")
app.add_typer(nodes_app, name="nodes")
app.add_typer(queues_app, name="queues")
app.command("usage")(usage)


@app.callback()
def _root(ctx: typer.Context) -> None:
    """Gantry: run the platform, administer it, emit events, audit, and govern data and models."""
    if not isinstance(ctx.obj, State):  # invoked without main(), e.g. by a test runner
        settings = load_settings(ClientSettings)
        configure_cli_logging(settings)
        ctx.obj = State(settings)


def main(argv: list[str] | None = None) -> int:
    """The ``gantry`` console script: load settings once, run the command, return its status."""
    try:
        settings = load_settings(ClientSettings)
    except GantryError as exc:
        print_error(exc)
        return EXIT_ERROR
    configure_cli_logging(settings)
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="gantry", standalone_mode=True, obj=State(settings))
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return EXIT_FAILED
    return 0


__all__ = [
    "AUDIT_KEY_ID",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "DecisionChoice",
    "ExportFormat",
    "State",
    "access_table",
    "app",
    "audit_trust",
    "configure_cli_logging",
    "main",
    "parse_time",
    "print_error",
]
