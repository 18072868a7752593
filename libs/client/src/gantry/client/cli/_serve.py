"""``gantry serve``: deploy registered models, split traffic, run canaries, and call them.

::

    gantry serve deploy --model churn [--version 2] [--canary 10%] [--env production]
    gantry serve status [NAME]          # one deployment in detail, or all of them
    gantry serve list
    gantry serve traffic NAME 1=90 2=10 [--sticky-header x-user-id | --no-sticky]
    gantry serve promote NAME | rollback NAME [--reason TEXT] | undeploy NAME
    gantry serve infer NAME --input 'INPUT__0=[[1, 2, 3]]' [--datatype FP32] [--json]
    gantry serve generate NAME "Once upon" [--max-tokens 64] [--temperature 0] [--seed 1]

The serving service is found like every service: ``GANTRY_DATA_DIR``'s ``run/serving.json``
written by the running service (see :meth:`~gantry.client.config.ClientSettings.address`).
Options that take a share accept ``10%`` or ``10``; durations accept ``60s``, ``1m``, ``250ms``
or plain seconds (``0.5``). A bad value is refused here, naming the option, before any call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    State,
    TokenOpt,
    command_settings,
    fmt_ms,
    state_of,
)
from gantry.client.config import ClientSettings
from gantry.core import InvalidInput

if TYPE_CHECKING:
    import numpy as np

    from gantry.client.serving import DeploymentInfo, ServingClient

serve_app = typer.Typer(
    help="Model serving: deploy, split traffic, canary rollouts, inference.",
    no_args_is_help=True,
)

DeploymentArg = Annotated[
    str, typer.Argument(help="Deployment name (the endpoint /v2/models/NAME).", show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="As JSON, for scripts.")]

#: The Open Inference Protocol's tensor datatypes the CLI can build from JSON or .npy.
DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64",
)  # fmt: skip

_STYLE = {
    "ready": "green",
    "loading": "cyan",
    "draining": "magenta",
    "failed": "bold red",
    "unknown": "dim",
    "progressing": "yellow",
    "promoted": "green",
    "rolled_back": "bold red",
}


class Environment(enum.StrEnum):
    """Values of --env."""

    staging = "staging"
    production = "production"


@contextlib.contextmanager
def serving_client(settings: ClientSettings) -> Iterator[ServingClient]:
    """A :class:`ServingClient` for the configured serving address and bearer token."""
    from gantry.client.serving import ServingClient

    with ServingClient(settings.address("serving"), settings.bearer(), tls=settings.tls) as client:
        yield client


# ---------------------------------------------------------------------- parsing


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_PERCENT = re.compile(rf"^\s*{_NUMBER}\s*(%?)\s*$")
_DURATION = re.compile(rf"^\s*{_NUMBER}\s*(ms|s|m|h)?\s*$")
_DURATION_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def parse_percent(text: str, flag: str, *, low: int = 0, high: int = 100) -> int:
    """A whole percentage written ``10%`` or ``10``, within ``low..high``; ``flag`` names the
    option in the error."""
    match = _PERCENT.match(text)
    value = float(match.group(1)) if match else math.nan
    if not match or not value.is_integer() or not low <= value <= high:
        raise InvalidInput(
            f"invalid {flag} {text!r}: expected a whole percentage {low}..{high}",
            hint=f"e.g. {flag} 10% or {flag} 10",
        )
    return int(value)


def parse_fraction(text: str, flag: str) -> float:
    """A share above 0 and at most 1, written as a fraction (``0.99``) or a percentage
    (``99%``, or ``99``: a plain number above 1 is read as a percentage)."""
    match = _PERCENT.match(text)
    value = float(match.group(1)) if match else math.nan
    if match and (match.group(2) or value > 1):
        value /= 100
    if not match or not 0 < value <= 1:
        raise InvalidInput(
            f"invalid {flag} {text!r}: expected a share above 0 and at most 100%",
            hint=f"e.g. {flag} 99% or {flag} 0.99",
        )
    return value


def parse_duration(text: str, flag: str) -> float:
    """Seconds (above 0) from ``60s``, ``1m``, ``1.5h``, ``250ms`` or a plain number of
    seconds (``0.5``)."""
    match = _DURATION.match(text)
    seconds = float(match.group(1)) * _DURATION_S[match.group(2) or "s"] if match else 0.0
    if seconds <= 0:
        raise InvalidInput(
            f"invalid {flag} {text!r}: expected a duration above 0",
            hint=f"e.g. {flag} 60s, {flag} 1m or {flag} 0.5 (seconds)",
        )
    return seconds


def parse_weights(pairs: Sequence[str]) -> dict[int, int]:
    """``VERSION=PERCENT`` pairs (``1=90 2=10``; ``v1=90%`` as well) as {version: weight}."""
    weights: dict[int, int] = {}
    for pair in pairs:
        version_text, sep, weight_text = pair.partition("=")
        version_text = version_text.strip().removeprefix("v")
        if not sep or not version_text.isdigit() or int(version_text) < 1:
            raise InvalidInput(
                f"invalid weight {pair!r}: expected VERSION=PERCENT",
                hint="e.g. gantry serve traffic NAME 1=90 2=10",
            )
        version = int(version_text)
        if version in weights:
            raise InvalidInput(f"v{version} is given twice", hint="give each version once")
        weights[version] = parse_percent(weight_text, f"weight of v{version}")
    return weights


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of a protocol datatype (``FP32``, ``int64``...), else InvalidInput."""
    import numpy as np

    name = datatype.strip().upper()
    if name not in DATATYPES:
        raise InvalidInput(
            f"unknown --datatype {datatype!r}", hint=f"one of {', '.join(DATATYPES)}"
        )
    names = {"BOOL": "bool", "FP16": "float16", "FP32": "float32", "FP64": "float64"}
    return np.dtype(names.get(name, name.lower()))


def parse_input(text: str, datatype: str | None = None) -> tuple[str, np.ndarray]:
    """An ``--input``: ``NAME=@file.npy`` (the array as saved, cast to ``datatype`` if given),
    ``NAME=@file.json`` or ``NAME=<JSON array>`` (as ``datatype``, default FP32)."""
    import numpy as np

    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name or not value.strip():
        raise InvalidInput(
            f"invalid --input {text!r}: expected NAME=@file.npy or NAME=<JSON array>",
            hint="e.g. --input 'INPUT__0=[[1, 2, 3]]' or --input INPUT__0=@features.npy",
        )
    dtype = numpy_dtype(datatype) if datatype else None
    where = f"--input {name}"
    if value.startswith("@"):
        path = Path(value[1:])
        where = f"--input {name} ({path})"
        if path.suffix.lower() == ".npy":
            try:
                array = np.load(path, allow_pickle=False)
            except OSError as exc:
                raise InvalidInput(f"can't read {path}: {exc.strerror or exc}") from None
            except ValueError as exc:
                raise InvalidInput(
                    f"{where} is not a numeric .npy array: {exc}",
                    hint="save it with numpy.save(path, array) (no object arrays)",
                ) from None
            if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
                raise InvalidInput(f"{where} holds {getattr(array, 'dtype', '?')}, not numbers")
            return name, array.astype(dtype) if dtype is not None else array
        try:
            value = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidInput(f"can't read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise InvalidInput(
                f"{where} is not JSON text", hint="give a .npy file or a JSON array"
            ) from None
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise InvalidInput(
            f"{where} is not valid JSON: {exc}", hint="e.g. --input 'INPUT__0=[[1, 2, 3]]'"
        ) from None
    if not isinstance(data, list | int | float | bool) or _has_strings(data):
        raise InvalidInput(
            f"{where} must be a JSON array of numbers", hint="e.g. [[1, 2, 3], [4, 5, 6]]"
        )
    try:
        return name, np.array(data, dtype=dtype if dtype is not None else np.float32)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(
            f"{where} is not a rectangular array of {(datatype or 'FP32').upper()} numbers",
            hint="every row must have the same length, e.g. [[1, 2], [3, 4]]",
        ) from None


def _has_strings(data: Any) -> bool:
    if isinstance(data, list):
        return any(_has_strings(item) for item in data)
    return data is None or isinstance(data, str | dict)


def parse_inputs(texts: Sequence[str], datatype: str | None = None) -> dict[str, np.ndarray]:
    """Every ``--input`` by name (each name once)."""
    inputs: dict[str, np.ndarray] = {}
    for text in texts:
        name, array = parse_input(text, datatype)
        if name in inputs:
            raise InvalidInput(f"--input {name} is given twice", hint="give each input once")
        inputs[name] = array
    if not inputs:
        raise InvalidInput("give at least one --input", hint="e.g. --input 'INPUT__0=[[1, 2, 3]]'")
    return inputs


# ---------------------------------------------------------------------- management


@serve_app.command("deploy")
def serve_deploy(
    ctx: typer.Context,
    model: Annotated[
        str, typer.Option("--model", "-m", help="Registered model to serve.", show_default=False)
    ],
    version: Annotated[
        int, typer.Option("--version", min=0, help="Model version; 0 = the latest registered.")
    ] = 0,
    name: Annotated[
        str, typer.Option("--name", help="Deployment name; default: the model's name.")
    ] = "",
    canary: Annotated[
        str | None,
        typer.Option(
            "--canary",
            help="Roll the version out as a canary starting at this share (10% or 10).",
            show_default=False,
        ),
    ] = None,
    shadow: Annotated[
        str | None,
        typer.Option(
            "--shadow",
            help="Add the version as a shadow mirroring this share of requests (5%).",
            show_default=False,
        ),
    ] = None,
    env: Annotated[
        Environment | None,
        typer.Option("--env", help="staging or production; default: staging (a new deployment)."),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", help="cpu, cuda or cuda:N; default: cpu.", show_default=False)
    ] = "",
    quantize: Annotated[
        bool, typer.Option("--quantize", help="Dynamic INT8 quantisation of linear layers.")
    ] = False,
    anonymous: Annotated[
        bool, typer.Option("--anonymous", help="Allow inference without a token.")
    ] = False,
    sticky_header: Annotated[
        str,
        typer.Option(
            "--sticky-header",
            help="Requests with the same value of this header keep their version.",
            show_default=False,
        ),
    ] = "",
    max_batch_size: Annotated[
        int, typer.Option("--max-batch-size", min=0, help="Most requests in one batch.")
    ] = 0,
    max_queue_delay_us: Annotated[
        int | None,
        typer.Option(
            "--max-queue-delay-us",
            min=0,
            help="Longest a request waits for others to join its batch (µs).",
            show_default=False,
        ),
    ] = None,
    queue_capacity: Annotated[
        int, typer.Option("--queue-capacity", min=0, help="Requests waiting at most.")
    ] = 0,
    timeout_ms: Annotated[
        int, typer.Option("--timeout-ms", min=0, help="A request not answered by then fails.")
    ] = 0,
    min_instances: Annotated[
        int, typer.Option("--min-instances", min=0, help="Model instances at least.")
    ] = 0,
    max_instances: Annotated[
        int, typer.Option("--max-instances", min=0, help="Model instances at most.")
    ] = 0,
    canary_step: Annotated[
        str | None,
        typer.Option(
            "--canary-step", help="Weight added after each passing check (10%).", show_default=False
        ),
    ] = None,
    canary_max: Annotated[
        str | None,
        typer.Option(
            "--canary-max", help="Promote after passing at this weight (50%).", show_default=False
        ),
    ] = None,
    canary_interval: Annotated[
        str | None,
        typer.Option(
            "--canary-interval", help="Time between checks (60s, 1m, 0.5).", show_default=False
        ),
    ] = None,
    canary_failures: Annotated[
        int | None,
        typer.Option(
            "--canary-failures",
            min=1,
            help="Failed checks before rollback (5).",
            show_default=False,
        ),
    ] = None,
    canary_success_rate: Annotated[
        str | None,
        typer.Option(
            "--canary-success-rate",
            help="Least share of successful canary requests (99% or 0.99).",
            show_default=False,
        ),
    ] = None,
    canary_p99_ms: Annotated[
        float | None,
        typer.Option(
            "--canary-p99-ms", help="Highest canary p99 latency in ms (500).", show_default=False
        ),
    ] = None,
    canary_min_requests: Annotated[
        int | None,
        typer.Option(
            "--canary-min-requests",
            help="Fewer canary requests in a window: the check is skipped (10).",
            show_default=False,
        ),
    ] = None,
    follow: Annotated[
        str | None,
        typer.Option(
            "--follow",
            help="Follow the model: each newly registered version starts a canary at this "
            "weight (e.g. 10%); 'off' stops following.",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Deploy a model version: new, hot swap, canary (--canary) or shadow (--shadow)."""
    follow_percent = 0
    if follow is not None:
        follow_percent = (
            -1
            if follow.strip().lower() == "off"
            else parse_percent(follow, "--follow", low=1, high=99)
        )
    canary_percent = parse_percent(canary, "--canary", low=1, high=99) if canary else 0
    shadow_percent = parse_percent(shadow, "--shadow", low=1) if shadow else 0
    if canary_percent and shadow_percent:
        raise InvalidInput(
            "a version is either a canary or a shadow: give --canary or --shadow, not both"
        )
    if device and not _DEVICE.match(device):
        raise InvalidInput(
            f"invalid --device {device!r}: expected cpu, cuda or cuda:N",
            hint="e.g. --device cuda:0",
        )
    policy = _canary_policy(
        step=canary_step,
        max_=canary_max,
        interval=canary_interval,
        failures=canary_failures,
        success_rate=canary_success_rate,
        p99_ms=canary_p99_ms,
        min_requests=canary_min_requests,
    )
    settings = command_settings(ctx, data_dir, token)
    with serving_client(settings) as client:
        info = client.deploy(
            model,
            version=version,
            name=name,
            canary_percent=canary_percent,
            shadow_percent=shadow_percent,
            environment=env.value if env else "",
            device=device,
            quantize=quantize,
            anonymous=anonymous,
            sticky_header=sticky_header,
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            queue_capacity=queue_capacity,
            timeout_ms=timeout_ms,
            min_instances=min_instances,
            max_instances=max_instances,
            canary=policy or None,
            follow_percent=follow_percent,
        )
    _print_change(state_of(ctx), info)


def _canary_policy(
    *,
    step: str | None,
    max_: str | None,
    interval: str | None,
    failures: int | None,
    success_rate: str | None,
    p99_ms: float | None,
    min_requests: int | None,
) -> dict[str, float]:
    """The canary analysis options given, as CanarySpec fields."""
    policy: dict[str, float] = {}
    if step is not None:
        policy["step_percent"] = parse_percent(step, "--canary-step", low=1)
    if max_ is not None:
        policy["max_percent"] = parse_percent(max_, "--canary-max", low=1)
    if interval is not None:
        policy["interval_s"] = parse_duration(interval, "--canary-interval")
    if failures is not None:
        policy["failure_threshold"] = failures
    if success_rate is not None:
        policy["min_success_rate"] = parse_fraction(success_rate, "--canary-success-rate")
    if p99_ms is not None:
        if not 0 < p99_ms < math.inf:
            raise InvalidInput(
                f"invalid --canary-p99-ms {p99_ms:g}: expected milliseconds above 0",
                hint="e.g. --canary-p99-ms 500",
            )
        policy["max_p99_ms"] = p99_ms
    if min_requests is not None:
        if min_requests < 1:  # 0 on the wire means "the default" (10)
            raise InvalidInput(
                f"invalid --canary-min-requests {min_requests}: a check needs at least 1 request",
                hint="e.g. --canary-min-requests 1 to judge on any traffic at all",
            )
        policy["min_requests"] = min_requests
    return policy


@serve_app.command("status")
def serve_status(
    ctx: typer.Context,
    name: Annotated[
        str, typer.Argument(help="One deployment; default: list every deployment.")
    ] = "",
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Show a deployment: versions, canary, settings and history (without NAME: all of them)."""
    settings = command_settings(ctx, data_dir, token)
    state = state_of(ctx)
    if not name:
        with serving_client(settings) as client:
            deployments = client.list()
        _print_list(state, deployments, as_json)
        return
    with serving_client(settings) as client:
        info = client.get(name)
        endpoint = _rest_endpoint(settings, client.address, info.name)
    if as_json:
        print(json.dumps({**_as_dict(info), "endpoint": endpoint}, indent=2))
        return
    _print_detail(state, info, endpoint)


@serve_app.command("list")
def serve_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """List deployments: model, traffic weights, canary phase and environment."""
    settings = command_settings(ctx, data_dir, token)
    with serving_client(settings) as client:
        deployments = client.list()
    _print_list(state_of(ctx), deployments, as_json)


@serve_app.command("traffic")
def serve_traffic(
    ctx: typer.Context,
    name: DeploymentArg,
    weights: Annotated[
        list[str] | None,
        typer.Argument(
            help="VERSION=PERCENT pairs adding up to 100, e.g. 1=90 2=10.", show_default=False
        ),
    ] = None,
    sticky_header: Annotated[
        str | None,
        typer.Option(
            "--sticky-header",
            help="Requests with the same value of this header keep their version.",
            show_default=False,
        ),
    ] = None,
    no_sticky: Annotated[
        bool, typer.Option("--no-sticky", help="Turn sticky routing off.")
    ] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Split a deployment's traffic by hand (A/B) and/or set its sticky routing header."""
    split = parse_weights(weights or ())
    if split and sum(split.values()) != 100:
        raise InvalidInput(
            f"the weights add up to {sum(split.values())}, not 100", hint="e.g. 1=90 2=10"
        )
    if sticky_header is not None and no_sticky:
        raise InvalidInput("give --sticky-header or --no-sticky, not both")
    if sticky_header is not None and not sticky_header.strip():
        raise InvalidInput(
            "--sticky-header needs a header name", hint="e.g. --sticky-header x-user-id"
        )
    header = "-" if no_sticky else (sticky_header or "").strip()
    if not split and not header:
        raise InvalidInput(
            "nothing to change: give weights, --sticky-header or --no-sticky",
            hint=f"e.g. gantry serve traffic {name} 1=90 2=10",
        )
    settings = command_settings(ctx, data_dir, token)
    with serving_client(settings) as client:
        info = client.set_traffic(name, split, sticky_header=header)
    _print_change(state_of(ctx), info)


@serve_app.command("promote")
def serve_promote(
    ctx: typer.Context,
    name: DeploymentArg,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Promote the canary now: it takes 100% and the old stable version is removed."""
    settings = command_settings(ctx, data_dir, token)
    with serving_client(settings) as client:
        info = client.promote(name)
    _print_change(state_of(ctx), info)


@serve_app.command("rollback")
def serve_rollback(
    ctx: typer.Context,
    name: DeploymentArg,
    reason: Annotated[str, typer.Option("--reason", help="Why; kept in the history.")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Roll the canary back now: the stable version takes 100% again."""
    settings = command_settings(ctx, data_dir, token)
    with serving_client(settings) as client:
        info = client.rollback(name, reason)
    _print_change(state_of(ctx), info)


@serve_app.command("undeploy")
def serve_undeploy(
    ctx: typer.Context,
    name: DeploymentArg,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Remove a deployment; its versions finish the requests they hold, then unload."""
    settings = command_settings(ctx, data_dir, token)
    with serving_client(settings) as client:
        info = client.undeploy(name)
    state_of(ctx).out.print(
        f"undeployed {info.name} (model {info.model}, was {_weights_text(info) or 'empty'})",
        markup=False,
        highlight=False,
    )


# ---------------------------------------------------------------------- inference


@serve_app.command("infer")
def serve_infer(
    ctx: typer.Context,
    name: DeploymentArg,
    inputs: Annotated[
        list[str],
        typer.Option(
            "--input",
            "-i",
            help="NAME=@file.npy, NAME=@file.json or NAME=<JSON array> (repeatable).",
            show_default=False,
        ),
    ],
    datatype: Annotated[
        str | None,
        typer.Option(
            "--datatype",
            help="Datatype of the inputs (FP32, INT64...); default: FP32 for JSON, the file's "
            "for .npy.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        str,
        typer.Option("--version", help="Ask this version (2 or v2); default: the router picks."),
    ] = "",
    as_json: JsonOpt = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Run one inference; print the version that answered and the outputs."""
    arrays = parse_inputs(inputs, datatype)
    settings = command_settings(ctx, data_dir, token)
    with serving_client(settings) as client:
        answered, outputs = client.infer(name, arrays, version=version.strip().removeprefix("v"))
    if as_json:
        print(json.dumps(_outputs_json(name, answered, outputs), indent=2))
        return
    import numpy as np

    out = state_of(ctx).out
    out.print(f"{name} v{answered} answered", markup=False, highlight=False)
    for output, array in outputs.items():
        shape = "x".join(str(n) for n in array.shape) or "scalar"
        out.print(f"{output} ({_datatype(array)}, {shape}):", markup=False, highlight=False)
        out.print(np.array2string(array), markup=False, highlight=False)


def _datatype(array: np.ndarray) -> str:
    names = {"bool": "BOOL", "float16": "FP16", "float32": "FP32", "float64": "FP64"}
    return names.get(array.dtype.name, array.dtype.name.upper())


def _outputs_json(name: str, version: str, outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """The answer in the shape of the protocol's REST response."""
    return {
        "model_name": name,
        "model_version": version,
        "outputs": [
            {
                "name": output,
                "datatype": _datatype(array),
                "shape": list(array.shape),
                "data": array.ravel().tolist(),
            }
            for output, array in outputs.items()
        ],
    }


@serve_app.command("generate")
def serve_generate(
    ctx: typer.Context,
    name: DeploymentArg,
    prompt: Annotated[str, typer.Argument(help="The text to continue.", show_default=False)],
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, help="Generate at most this many tokens.")
    ] = 64,
    temperature: Annotated[
        float, typer.Option("--temperature", min=0.0, help="0 = always the likeliest token.")
    ] = 0.0,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed", help="Seed of the sampling, for repeatable text.", show_default=False
        ),
    ] = None,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Generate text from a generative model, printed as it streams."""
    settings = command_settings(ctx, data_dir, token)
    # raw, not through rich: generated text keeps its brackets, and each piece is flushed
    file = state_of(ctx).out.file
    with serving_client(settings) as client:
        pieces = client.generate(
            name, prompt, max_tokens=max_tokens, temperature=temperature, seed=seed
        )
        wrote = False
        try:
            for piece in pieces:
                file.write(piece)
                file.flush()
                wrote = True
        except KeyboardInterrupt:
            pass
        finally:
            if wrote:  # end the line before anything else (an error) is printed
                file.write("\n")
                file.flush()


# ---------------------------------------------------------------------- printing


def _rest_endpoint(settings: ClientSettings, address: str, name: str) -> str | None:
    """The REST inference URL when the CLI talks to the platform of its data directory."""
    from gantry.core.runfile import run_info

    if run_info(settings.data_dir, "serving", "grpc") != address:
        return None
    http = run_info(settings.data_dir, "serving", "http")
    return f"{http.rstrip('/')}/v2/models/{name}/infer" if http else None


def _as_dict(info: DeploymentInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


def _styled(text: str) -> str:
    style = _STYLE.get(text)
    return f"[{style}]{escape(text)}[/]" if style else escape(text)


def _weights_text(info: DeploymentInfo) -> str:
    """``v1 90% / v2 10%`` (and a shadow's share)."""
    routed = " / ".join(f"v{v.version} {v.weight}%" for v in info.versions if v.role != "shadow")
    shadows = [v.version for v in info.versions if v.role == "shadow"]
    if shadows:
        mirrored = f"+ shadow v{shadows[0]} {info.shadow_percent}%"
        return f"{routed} {mirrored}" if routed else mirrored
    return routed


def _canary_text(info: DeploymentInfo) -> str:
    c = info.canary
    if not c.phase:
        return ""
    if c.phase == "progressing":
        return f"progressing v{c.canary_version} {c.weight}%"
    return f"{c.phase} v{c.canary_version}"


def _print_change(state: State, info: DeploymentInfo) -> None:
    """What a management call did (its history entry) and the deployment's weights."""
    what = info.history[-1].detail if info.history else f"deployment {info.name} updated"
    state.out.print(f"{info.name}: {what}", markup=False, highlight=False)
    _print_versions(state, info, load=False)
    if info.canary.phase == "progressing":
        spec = info.settings["canary"]
        state.out.print(
            f"canary v{info.canary.canary_version} progressing at {info.canary.weight}%: "
            f"+{spec['step_percent']}% every {_seconds(spec['interval_s'])} while checks pass, "
            f"promoted after passing at {spec['max_percent']}%; follow it with "
            f"'gantry serve status {info.name}'",
            markup=False,
            highlight=False,
        )


def _versions_table(info: DeploymentInfo) -> Table:
    """Each version's place in the deployment (two tables fit 80 columns; one would not)."""
    table = Table(title=f"{info.name} ({info.model})")
    for col in ("version", "role", "weight", "state", "instances", "device", "quantized"):
        table.add_column(col, justify="right" if col in _NUMERIC else "left")
    for v in info.versions:
        weight = f"mirror {info.shadow_percent}%" if v.role == "shadow" else f"{v.weight}%"
        table.add_row(
            f"v{v.version}",
            escape(v.role),
            weight,
            _styled(v.state),
            str(v.instances),
            escape(v.device),
            "yes" if v.quantized else "no",
        )
    return table


def _load_table(info: DeploymentInfo) -> Table:
    """Each version's live figures."""
    table = Table(title="load")
    for col in ("version", "requests", "errors", "p99 ms", "queued"):
        table.add_column(col, justify="right")
    for v in info.versions:
        p99 = f"{v.p99_ms:.1f}" if v.p99_ms else "-"
        table.add_row(f"v{v.version}", f"{v.requests:,}", f"{v.errors:,}", p99, f"{v.queued:,}")
    return table


def _print_versions(state: State, info: DeploymentInfo, *, load: bool) -> None:
    state.out.print(_versions_table(info))
    for v in info.versions:
        if v.reason:
            state.out.print(f"  v{v.version} {v.state}: {escape(v.reason)}", highlight=False)
    if load:
        state.out.print(_load_table(info))


_NUMERIC = {"version", "weight", "instances"}


def _print_list(state: State, deployments: list[DeploymentInfo], as_json: bool) -> None:
    if as_json:
        print(json.dumps([_as_dict(d) for d in deployments], indent=2))
        return
    n = len(deployments)
    table = Table(title=f"{n} deployment{'' if n == 1 else 's'}")
    for col in ("name", "model", "weights", "canary", "environment"):
        table.add_column(col)
    for d in deployments:
        canary = _canary_text(d)
        table.add_row(
            escape(d.name),
            escape(d.model),
            escape(_weights_text(d)),
            _styled(d.canary.phase) + escape(canary.removeprefix(d.canary.phase)) if canary else "",
            escape(d.environment),
        )
    state.out.print(table)


def _print_detail(state: State, info: DeploymentInfo, endpoint: str | None) -> None:
    out = state.out
    out.print(
        f"deployment [bold]{escape(info.name)}[/]: model {escape(info.model)}, "
        f"{escape(info.environment)}, {escape(_weights_text(info) or 'no versions')}"
    )
    if endpoint:
        out.print(f"  REST: POST {escape(endpoint)}", highlight=False)
    _print_versions(state, info, load=True)

    c, spec = info.canary, info.settings["canary"]
    if c.phase:
        canary = Table.grid(padding=(0, 2))
        canary.add_column(style="bold")
        canary.add_column()
        rows = [
            ("canary", f"{_styled(c.phase)} v{c.canary_version} against v{c.stable_version}"),
            ("weight", f"{c.weight}%"),
            ("failed checks", f"{c.failed_checks}/{spec['failure_threshold']}"),
            ("last check", escape(c.last_check) or "none yet"),
            ("started", fmt_ms(c.started_ms)),
            ("updated", fmt_ms(c.updated_ms)),
        ]
        for label, value in rows:
            if value:
                canary.add_row(label, value)
        out.print(canary)
    else:
        out.print("canary: none has run", highlight=False)

    s = info.settings
    fields = Table.grid(padding=(0, 2))
    fields.title, fields.title_justify = "settings", "left"
    fields.add_column(style="bold")
    fields.add_column()
    settings_rows = [
        ("device", info.device),
        ("quantize", "yes (dynamic INT8)" if info.quantize else "no"),
        ("anonymous inference", "allowed" if info.anonymous else "no (a token is needed)"),
        ("sticky header", info.sticky_header or "none"),
        ("shadow", f"{info.shadow_percent}% mirrored" if info.shadow_percent else "none"),
        (
            "follows new versions",
            f"yes: each starts a {info.follow_percent}% canary" if info.follow_percent else "no",
        ),
        ("max batch size", _or_default(s["max_batch_size"])),
        ("max queue delay", f"{s['max_queue_delay_us']} µs"),
        ("queue capacity", _or_default(s["queue_capacity"])),
        ("timeout", _or_default(s["timeout_ms"], " ms")),
        ("instances", _instances(s["min_instances"], s["max_instances"])),
        (
            "canary analysis",
            f"step {spec['step_percent']}%, promote after {spec['max_percent']}%, every "
            f"{_seconds(spec['interval_s'])}; roll back after {spec['failure_threshold']} "
            f"failed checks; success rate >= {spec['min_success_rate'] * 100:.4g}%, p99 <= "
            f"{spec['max_p99_ms']:g} ms, at least {spec['min_requests']} requests a check",
        ),
    ]
    for label, value in settings_rows:
        fields.add_row(label, escape(value))
    out.print(fields)

    if info.history:
        history = Table(title="history")
        for col in ("time (UTC)", "action", "detail", "actor"):
            history.add_column(col)
        for h in info.history:
            history.add_row(fmt_ms(h.at_ms), escape(h.action), escape(h.detail), escape(h.actor))
        out.print(history)


def _instances(low: int, high: int) -> str:
    if not low and not high:
        return "default"
    return f"{_or_default(low)}..{_or_default(high)}"


def _or_default(value: int, unit: str = "") -> str:
    return f"{value}{unit}" if value else "default"


def _seconds(seconds: float) -> str:
    """``0.5s``, ``90s``, ``5m``, ``1h30m``."""
    if seconds < 60 or seconds % 60:
        return f"{seconds:g}s"
    hours, minutes = divmod(int(seconds // 60), 60)
    if not hours:
        return f"{minutes}m"
    return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"


__all__ = [
    "DATATYPES",
    "Environment",
    "numpy_dtype",
    "parse_duration",
    "parse_fraction",
    "parse_input",
    "parse_inputs",
    "parse_percent",
    "parse_weights",
    "serve_app",
    "serving_client",
]
