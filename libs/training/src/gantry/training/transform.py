"""``python -m gantry.training.transform module:function [key=value ...]``: a data job's worker.

The node agent starts this for a job whose ``spec.entrypoint`` is a ``transform``. It builds
the job's :class:`~gantry.training.task.DataContext` (the governed inputs of ``spec.data``,
read through the job's grant in its view, exactly as a task's dataset factories read them),
calls ``function(ctx)`` and writes the table it returns (a ``pyarrow.Table`` or a pandas
``DataFrame``) as Parquet under ``$GANTRY_OUTPUT_DIR/dataset/``, with ``rows`` in
``metrics.json``. Once the worker exits 0 the agent commits the table as a new version of
``spec.output.dataset``. ``args`` are ``key=value`` strings in ``ctx.params``::

    def features(ctx: DataContext) -> pa.Table:
        table = ctx.table("churn")               # the job's version, de-identified
        return table.drop_null()

Without ``$GANTRY_OUTPUT_DIR`` (by hand) the table is described and not written.

Exit codes: 0 done; 1 the user's code raised (its traceback is on stderr); 2 the job is
misconfigured (the function is missing or returned no table).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from gantry.core import CommonSettings, GantryError, InvalidInput, configure_logging, load_settings
from gantry.training.outputs import as_arrow, write_metrics, write_table
from gantry.training.task import DataContext, load_reference, read_spec
from gantry.training.trainer import WorkerEnv

EXIT_USER_ERROR = 1
EXIT_CONFIG = 2

Transform = Callable[[DataContext], Any]


class TransformSettings(CommonSettings):
    """What a transform worker reads from the environment the agent gives it."""

    output_dir: Path | None = Field(
        default=None,
        description="Where the table is written, under dataset/ (GANTRY_OUTPUT_DIR).",
    )


def parse_params(args: Sequence[str]) -> dict[str, str]:
    """``key=value`` arguments as the transform's parameters (strings)."""
    params: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InvalidInput(
                f"argument {arg!r} is not key=value",
                hint="give a transform's parameters as entrypoint.args: [min_rows=100]",
            )
        params[key] = value
    return params


def load_transform(reference: str) -> Transform:
    """The function at ``module:function``; :class:`InvalidInput` if it is not callable."""
    value = load_reference(reference, example="entrypoint: {transform: my_package.prep:clean}")
    if not callable(value):
        raise InvalidInput(
            f"{reference} is a {type(value).__name__}, not a function",
            hint="point entrypoint.transform at a function taking a DataContext",
        )
    function: Transform = value
    return function


def transform(reference: str, args: Sequence[str], settings: TransformSettings) -> int:
    """Run the transform at ``reference`` and write its table; the process exit code."""
    env = WorkerEnv.from_environ()
    spec, _name = read_spec()
    params = parse_params(args)
    function = load_transform(reference)
    if env.rank != 0:
        print(f"rank {env.rank}: a transform runs on rank 0 only", flush=True)
        return 0
    ctx = DataContext(env, spec, params=params)
    table = as_arrow(function(ctx), where=reference)
    columns = ", ".join(table.column_names)
    if settings.output_dir is None:
        print(f"{reference}: {table.num_rows} rows ({columns}); GANTRY_OUTPUT_DIR is not set, "
              "so nothing was written", flush=True)  # fmt: skip
        return 0
    path = write_table(table, settings.output_dir)
    write_metrics(settings.output_dir, {"rows": table.num_rows})
    print(f"wrote {table.num_rows} rows ({columns}) to {path}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring for the exit codes."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0 if argv else EXIT_CONFIG
    try:
        settings = load_settings(TransformSettings)
        configure_logging("transform-worker", level=settings.log_level, json=settings.log_json)
        return transform(argv[0], argv[1:], settings)
    except GantryError as exc:
        print(f"gantry: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except Exception:  # the user's code: show their traceback, as Python would
        traceback.print_exc()
        sys.stderr.flush()
        return EXIT_USER_ERROR


__all__ = ["Transform", "TransformSettings", "load_transform", "main", "parse_params", "transform"]


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
