"""``python -m gantry.training.examples [NAME] [--version ID] [--data DIR]``.

Without NAME: the examples, one a line. With NAME: the example's job YAML on stdout
(``--version ID`` pins the dataset version of an example that reads data). ``--data DIR``
writes the data an example needs into DIR (the tabular example's table and schema file) and
says on stderr how to put it into governance. Exit status 0, or 2 with ``gantry: error:``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from gantry.core import GantryError, InvalidInput
from gantry.training.examples import EXAMPLES, Example, example

_VERSION = re.compile(r"[0-9a-f]{6,64}")
_LATEST = re.compile(r"version: latest\b")


def _listing() -> str:
    width = max(len(e.name) for e in EXAMPLES)
    lines = [f"{e.name:<{width}}  {e.summary}" for e in EXAMPLES]
    lines.append("")
    lines.append("python -m gantry.training.examples NAME > job.yaml; gantry jobs submit job.yaml")
    return "\n".join(lines)


def _pinned(item: Example, version: str) -> str:
    text = item.job_yaml()
    if not _LATEST.search(text):
        raise InvalidInput(
            f"example {item.name} reads no dataset, so it has no version to pin",
            hint="leave out --version",
        )
    if not _VERSION.fullmatch(version.lower()):
        raise InvalidInput(
            f"{version!r} is not a version id",
            hint="give the id or at least its first 6 hex digits (gantry data log churn)",
        )
    return _LATEST.sub(f'version: "{version.lower()}"', text)


def _write_data(item: Example, directory: Path) -> None:
    if item.name != "tabular":
        raise InvalidInput(
            f"example {item.name} needs no data: it generates its own",
            hint="leave out --data",
        )
    import pyarrow.csv

    from gantry.training.examples import tabular

    directory.mkdir(parents=True, exist_ok=True)
    schema = directory / f"{tabular.DATASET}.schema.yaml"
    table_path = directory / f"{tabular.DATASET}.csv"
    schema.write_text(tabular.SCHEMA_YAML)
    table = tabular.churn_table()
    pyarrow.csv.write_csv(table, table_path)
    print(
        f"wrote {table.num_rows:,} rows to {table_path} and the schema to {schema}; then:\n"
        f"  gantry data create {tabular.DATASET} --schema {schema}\n"
        f"  gantry data upload {tabular.DATASET} {table_path} --commit -m 'example churn table'",
        file=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m gantry.training.examples",
        description="List the example training jobs, or print one's job YAML.",
    )
    parser.add_argument("name", nargs="?", help="the example whose job YAML to print")
    parser.add_argument("--version", help="pin this dataset version in the YAML")
    parser.add_argument("--data", type=Path, metavar="DIR", help="write the example's data here")
    args = parser.parse_args(argv)
    try:
        if args.name is None:
            if args.version or args.data:
                raise InvalidInput("--version and --data need an example name")
            print(_listing())
            return 0
        item = example(args.name)
        if args.data is not None:
            _write_data(item, args.data)
            return 0
        text = _pinned(item, args.version) if args.version else item.job_yaml()
        sys.stdout.write(text)
        return 0
    except GantryError as exc:
        print(f"gantry: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"gantry: hint: {exc.hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
