"""``gantry data grant | grants | revoke | lineage``: jobs' access to data, and where it went."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    TokenOpt,
    command_settings,
    fmt_ms,
    governance_client,
    iso_ms,
    state_of,
)
from gantry.client.cli._data_access import ViewChoice, ViewOpt
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.governance import LineageEdge


def data_grant(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job that may read.")],
    versions: Annotated[
        list[str], typer.Argument(help="NAME@VERSION of each dataset version it may read.")
    ],
    view: ViewOpt = ViewChoice.deidentified,
    ttl: Annotated[str, typer.Option("--ttl", help="Lifetime: 30m, 12h, 7d.")] = "1h",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Let a job read dataset versions in a view; print the grant token (once)."""
    from gantry.client.specs import VersionRef
    from gantry.security import parse_ttl

    refs = [VersionRef.parse(text) for text in versions]
    ttl_s = int(parse_ttl(ttl).total_seconds())
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with governance_client(settings) as client:
        grant = client.issue_grant(job_id, refs, view.value, ttl_s)
    state.err.print(
        f"grant {grant.id}: job {grant.job_id} may read "
        f"{', '.join(str(v) for v in grant.versions)} ({grant.view} view) until "
        f"{iso_ms(grant.expires_ms) if grant.expires_ms else 'the service default'}",
        markup=False,
    )
    state.err.print(
        "warning: the token below is a secret: hand it to the job only (e.g. as a secret "
        "environment variable); it is not shown again and anyone holding it can read this data",
        style="yellow",
        highlight=False,
        markup=False,
    )
    print(grant.token)


def data_grants(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Option("--job", help="Only this job's grants.")] = "",
    include_expired: Annotated[bool, typer.Option("--all", help="Include expired grants.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List grants (never their tokens), newest first."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        grants = client.list_grants(job_id, include_expired=include_expired)
    table = Table(title=f"{len(grants)} grant{'' if len(grants) == 1 else 's'}")
    for col in ("grant", "job", "view", "versions", "expires (UTC)", "issued by", "state"):
        table.add_column(col)
    for g in grants:
        table.add_row(
            g.id,
            escape(g.job_id),
            g.view,
            escape(", ".join(str(v) for v in g.versions)),
            iso_ms(g.expires_ms),
            escape(g.issued_by),
            "revoked" if g.revoked else "active",
        )
    state_of(ctx).out.print(table)


def data_revoke(
    ctx: typer.Context,
    grant_id: Annotated[str, typer.Argument(help="The grant id (see `gantry data grants`).")],
    reason: Annotated[str, typer.Option("--reason", help="Why; recorded in the audit.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a grant: its token opens nothing from now on."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        grant = client.revoke_grant(grant_id, reason)
    state_of(ctx).out.print(f"grant {grant.id} of job {grant.job_id} is revoked", markup=False)


# ---------------------------------------------------------------------- lineage


def data_lineage(
    ctx: typer.Context,
    dataset: Annotated[
        str, typer.Option("--dataset", help="With --version: who read it.", show_default=False)
    ] = "",
    version: Annotated[
        str, typer.Option("--version", help="The dataset version.", show_default=False)
    ] = "",
    job: Annotated[
        str, typer.Option("--job", help="What a job read and produced.", show_default=False)
    ] = "",
    model: Annotated[
        str,
        typer.Option(
            "--model", help="With --model-version: where it came from.", show_default=False
        ),
    ] = "",
    model_version: Annotated[
        int | None,
        typer.Option("--model-version", min=1, help="The model version.", show_default=False),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Lineage of a dataset version, a job, or a model version."""
    modes = [bool(dataset or version), bool(job), bool(model or model_version)]
    usage = "--dataset NAME --version V, or --job JOB, or --model NAME --model-version N"
    if sum(modes) != 1:
        raise InvalidInput(f"give exactly one of: {usage}")
    if modes[0] and not (dataset and version):
        raise InvalidInput("--dataset and --version go together", hint=f"give {usage}")
    if modes[2] and not (model and model_version):
        raise InvalidInput("--model and --model-version go together", hint=f"give {usage}")
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        edges = client.lineage(
            dataset=dataset,
            version=version,
            job_id=job,
            model=model,
            model_version=model_version or "",
        )
    subject = (
        f"{dataset}@{version}"
        if modes[0]
        else f"job {job}"
        if modes[1]
        else (f"model {model} v{model_version}")
    )
    state_of(ctx).out.print(lineage_table(subject, edges))


def lineage_table(subject: str, edges: list[LineageEdge]) -> Table:
    """Lineage edges as a table: from, to, time."""
    table = Table(
        title=f"Lineage of {escape(subject)}: {len(edges)} edge{'' if len(edges) == 1 else 's'}"
    )
    for col in ("from", "", "to", "time (UTC)"):
        table.add_column(col)
    for e in edges:
        table.add_row(
            f"{e.from_kind} {escape(e.from_id)}",
            "→",
            f"{e.to_kind} {escape(e.to_id)}",
            fmt_ms(e.time_ms),
        )
    return table
