"""``gantry models``: register model artifacts with their lineage, list, show and download."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.filesize import decimal
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    TokenOpt,
    command_settings,
    fmt_ms,
    governance_client,
    state_of,
    transfer_progress,
)
from gantry.core import InvalidInput

if TYPE_CHECKING:
    from gantry.client.model_registry import ModelVersion

models_app = typer.Typer(help="The model registry.", no_args_is_help=True)

ModelArg = Annotated[str, typer.Argument(help="Model name.", show_default=False)]
ModelVersionOpt = Annotated[
    int, typer.Option("--version", min=0, help="Model version; 0 = the latest.")
]


def parse_metric(text: str) -> tuple[str, float]:
    """``name=number`` as (name, value)."""
    name, sep, value = text.partition("=")
    try:
        if not sep or not name.strip():
            raise ValueError(text)
        return name.strip(), float(value)
    except ValueError:
        raise InvalidInput(
            f"invalid --metric {text!r}: expected name=number, e.g. accuracy=0.93"
        ) from None


def _metrics_text(metrics: dict[str, float] | Any) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(metrics.items()))


def _short(code_version: str) -> str:
    """A code version's first word, cut to fit a table column (``show`` prints it whole)."""
    first, _, rest = code_version.partition(" ")
    if len(first) > 22:
        return first[:21] + "…"
    return first + ("…" if rest else "")


@models_app.command("list")
def models_list(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Only this model's versions.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List registered model versions (of every model, or of NAME)."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        versions = client.list_models(name)
    table = Table(title=f"{len(versions)} model version{'' if len(versions) == 1 else 's'}")
    columns = ("model", "version", "framework", "size", "job", "code", "metrics", "by")
    for col in (*columns, "created (UTC)"):
        table.add_column(col, justify="right" if col in ("version", "size") else "left")
    for m in versions:
        table.add_row(
            escape(m.name),
            str(m.version),
            escape(m.framework),
            decimal(m.bytes),
            escape(m.job_id),
            escape(_short(m.code_version)),
            escape(_metrics_text(m.metrics)),
            escape(m.registered_by),
            fmt_ms(m.created_ms),
        )
    state_of(ctx).out.print(table)


@models_app.command("show")
def models_show(
    ctx: typer.Context,
    name: ModelArg,
    version: ModelVersionOpt = 0,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a model version: digest, metrics, signature and what it was trained on."""
    settings = command_settings(ctx, data_dir, token)
    with governance_client(settings) as client:
        m = client.get_model(name, version)
    out = state_of(ctx).out
    lines = [
        f"model {m.name} v{m.version} ({m.framework})",
        f"sha256 {m.digest}, {decimal(m.bytes)}",
        f"registered by {m.registered_by} at {fmt_ms(m.created_ms)} UTC",
    ]
    if m.description:
        lines.append(m.description)
    if m.job_id:
        lines.append(f"produced by job {m.job_id}")
    if m.code_version:
        lines.append(f"code version {m.code_version}")
    if m.trained_on:
        lines.append("trained on " + ", ".join(str(v) for v in m.trained_on))
    if m.metrics:
        lines.append("metrics: " + _metrics_text(m.metrics))
    for line in lines:
        out.print(line, markup=False)
    if m.signature_json:
        out.print("signature:", markup=False)
        out.print_json(m.signature_json)


@models_app.command("register")
def models_register(
    ctx: typer.Context,
    name: ModelArg,
    path: Annotated[Path, typer.Argument(help="The model artifact file.")],
    framework: Annotated[
        str, typer.Option("--framework", help="e.g. pytorch, sklearn, onnx.", show_default=False)
    ],
    job: Annotated[str, typer.Option("--job", help="The job that produced it (lineage).")] = "",
    metric: Annotated[
        list[str] | None,
        typer.Option(
            "--metric", help="name=number, e.g. accuracy=0.93 (repeatable).", show_default=False
        ),
    ] = None,
    trained_on: Annotated[
        list[str] | None,
        typer.Option(
            "--trained-on",
            help="NAME@VERSION of a dataset version (repeatable).",
            show_default=False,
        ),
    ] = None,
    signature: Annotated[
        Path | None,
        typer.Option(
            "--signature", help="JSON file describing inputs and outputs.", show_default=False
        ),
    ] = None,
    description: Annotated[str, typer.Option("--description", help="What it is.")] = "",
    code_version: Annotated[
        str,
        typer.Option(
            "--code-version", help="The code that trained it, e.g. a commit id (lineage)."
        ),
    ] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Register PATH as the next version of model NAME."""
    from gantry.client.specs import VersionRef

    metrics = dict(parse_metric(text) for text in metric or ())
    refs = [VersionRef.parse(text) for text in trained_on or ()]
    signature_doc = _load_json(signature) if signature is not None else None
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with (
        governance_client(settings) as client,
        transfer_progress(state, f"uploading {path.name}", path.stat().st_size) as advance,
    ):
        model = client.register_model(
            name,
            path,
            framework=framework,
            job_id=job,
            metrics=metrics,
            signature=signature_doc,
            description=description,
            trained_on=refs,
            code_version=code_version,
            progress=advance,
        )
    _print_stored(state.out, "registered", model)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"can't read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc}") from None


def _print_stored(out: Any, verb: str, model: ModelVersion, where: str = "") -> None:
    out.print(
        f"{verb} {model.name} v{model.version}{where} ({decimal(model.bytes)}, "
        f"sha256 {model.digest})",
        markup=False,
    )


@models_app.command("download")
def models_download(
    ctx: typer.Context,
    name: ModelArg,
    dest: Annotated[Path, typer.Argument(help="File to write the artifact to.")],
    version: ModelVersionOpt = 0,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Download a model version's artifact to DEST (checked against its sha256)."""
    if dest.is_dir():
        raise InvalidInput(f"{dest} is a directory", hint=f"give a file path, e.g. {dest / name}")
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    with governance_client(settings) as client:
        info = client.get_model(name, version)
        with transfer_progress(state, f"downloading {name} v{info.version}", info.bytes) as advance:
            model = client.download_model(name, dest, version=info.version, progress=advance)
    _print_stored(state.out, "downloaded", model, f" to {dest}")
