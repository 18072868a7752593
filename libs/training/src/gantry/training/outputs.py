"""What a finished job leaves for its node agent in ``$GANTRY_OUTPUT_DIR``.

- ``metrics.json``: ``{"name": number, ...}``, the job's final metrics. Rank 0 of the
  training runtime writes it (training and evaluation), the transform runtime too, and any
  entrypoint may. The agent sends them with the job's success; the scheduler keeps them with
  the job (``gantry jobs get``).
- ``dataset/*.parquet``: the table a data job commits as a version of ``spec.output.dataset``.
  The transform runtime writes ``dataset/part-00000.parquet``; a module or command entrypoint
  may write any number of Parquet files there, all with the dataset's columns.
- ``model.json`` and the exported artefact: the model (:mod:`gantry.training.export`).

Nothing here imports torch: the node agent reads these files too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gantry.core import InvalidInput

METRICS_FILE = "metrics.json"
DATASET_DIR = "dataset"
#: The most metrics one job reports (they travel in one event, and are shown in one table).
MAX_METRICS = 256
#: The longest metric name.
MAX_METRIC_NAME = 128
#: The largest metrics file read (a bigger one is not a file of a few hundred numbers).
MAX_METRICS_BYTES = 64 << 10


def clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Metrics as finite floats (numpy and 0-d tensor values too); a clear error for anything
    else."""
    out = {}
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidInput(f"metric {key!r} is {value!r}, not a number") from None
        if not math.isfinite(number):
            raise InvalidInput(f"metric {key!r} is {number}, not a finite number")
        out[str(key)] = number
    return out


def write_metrics(directory: Path, metrics: Mapping[str, Any]) -> Path:
    """Write ``metrics`` (finite numbers) as ``<directory>/metrics.json``, atomically."""
    cleaned = clean_metrics(metrics)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / METRICS_FILE
    tmp = directory / f".{METRICS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(cleaned, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def read_metrics(directory: Path) -> dict[str, float]:
    """The metrics in ``<directory>/metrics.json``; {} when there is no such file.

    A file that is not a JSON object of at most :data:`MAX_METRICS` names (each at most
    :data:`MAX_METRIC_NAME` characters) with finite numbers (not booleans, not strings) raises
    :class:`InvalidInput` saying what is wrong, so the caller can ignore it all.
    """
    path = directory / METRICS_FILE
    if not path.is_file():
        return {}
    try:
        size = path.stat().st_size
        if size > MAX_METRICS_BYTES:
            raise InvalidInput(f"{path} is {size:,} bytes, more than a metrics file holds")
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{path} is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidInput(f"{path} holds a {type(raw).__name__}, not an object of metrics")
    if len(raw) > MAX_METRICS:
        raise InvalidInput(f"{path} holds {len(raw)} metrics, more than {MAX_METRICS}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if not key or len(key) > MAX_METRIC_NAME:
            raise InvalidInput(f"{path}: metric name {key[:40]!r} is empty or too long")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInput(f"{path}: metric {key!r} is {value!r}, not a number")
        if not math.isfinite(value):
            raise InvalidInput(f"{path}: metric {key!r} is {value}, not a finite number")
        out[key] = float(value)
    return out


def dataset_files(directory: Path) -> list[Path]:
    """The Parquet files under ``<directory>/dataset/`` (and its subdirectories), sorted."""
    root = directory / DATASET_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.parquet") if p.is_file())


def as_arrow(value: Any, *, where: str) -> Any:
    """``value`` as a ``pyarrow.Table``: a Table as it is, a pandas DataFrame converted
    (without its index); anything else is an error naming ``where`` it came from."""
    import pyarrow as pa

    if isinstance(value, pa.Table):
        return value
    if type(value).__name__ == "DataFrame" and hasattr(value, "to_dict"):
        try:
            return pa.Table.from_pandas(value, preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise InvalidInput(f"{where}: the DataFrame has no Arrow form: {exc}") from None
    raise InvalidInput(
        f"{where} returned a {type(value).__name__}, not a table",
        hint="return a pyarrow.Table or a pandas.DataFrame",
    )


def write_table(table: Any, directory: Path) -> Path:
    """Write ``table`` (a ``pyarrow.Table``) as ``<directory>/dataset/part-00000.parquet``,
    replacing any Parquet file there (a rerun's output is the whole output)."""
    import pyarrow.parquet as pq

    root = directory / DATASET_DIR
    root.mkdir(parents=True, exist_ok=True)
    for old in dataset_files(directory):
        old.unlink()
    path = root / "part-00000.parquet"
    tmp = root / f".part-00000.{os.getpid()}.tmp"
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


__all__ = [
    "DATASET_DIR",
    "MAX_METRICS",
    "METRICS_FILE",
    "as_arrow",
    "clean_metrics",
    "dataset_files",
    "read_metrics",
    "write_metrics",
    "write_table",
]
