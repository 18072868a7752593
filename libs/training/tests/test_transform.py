"""``python -m gantry.training.transform``, run as the node agent runs it: a real process with
the agent's environment and a small transform module on PYTHONPATH. It writes the table as
Parquet where the agent uploads it from, maps failures to its exit codes; the example
``features`` transform cleans the churn table into what the churn task trains on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gantry.core import InvalidInput
from gantry.training.examples import tabular
from gantry.training.outputs import dataset_files, read_metrics, write_metrics
from gantry.training.task import DataContext
from gantry.training.trainer import WorkerEnv
from gantry.training.transform import EXIT_CONFIG, EXIT_USER_ERROR, parse_params

TRANSFORMS = """
    import pyarrow as pa

    def squares(ctx):
        n = int(ctx.params.get("rows", "3"))
        return pa.table({"n": list(range(n)), "square": [i * i for i in range(n)]})

    def nothing(ctx):
        return [1, 2, 3]

    def boom(ctx):
        raise ValueError("the input has no column 'tenure'")

    not_a_function = 42
"""


def run_transform(
    tmp_path: Path, reference: str, *args: str, output: bool = True
) -> tuple[int, str, str]:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "prep.py").write_text(textwrap.dedent(TRANSFORMS))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GANTRY_")}
    env |= {"PYTHONPATH": str(code), "GANTRY_DATA_DIR": str(tmp_path / "data")}
    if output:
        env["GANTRY_OUTPUT_DIR"] = str(tmp_path / "output")
    done = subprocess.run(
        [sys.executable, "-m", "gantry.training.transform", reference, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def test_a_transform_writes_its_table_as_parquet_for_the_agent(tmp_path: Path) -> None:
    output = tmp_path / "output"
    stale = output / "dataset" / "old.parquet"
    stale.parent.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), stale)  # a crashed run's leftovers are replaced

    code, out, err = run_transform(tmp_path, "prep:squares", "rows=5")

    assert code == 0, err
    [written] = dataset_files(output)
    assert written == output / "dataset" / "part-00000.parquet"
    assert pq.read_table(written).to_pydict() == {"n": [0, 1, 2, 3, 4], "square": [0, 1, 4, 9, 16]}
    assert read_metrics(output) == {"rows": 5.0}
    assert f"wrote 5 rows (n, square) to {written}" in out


def test_without_an_output_dir_the_table_is_described_not_written(tmp_path: Path) -> None:
    code, out, err = run_transform(tmp_path, "prep:squares", output=False)
    assert code == 0, err
    assert "prep:squares: 3 rows (n, square); GANTRY_OUTPUT_DIR is not set" in out
    assert not (tmp_path / "output").exists()


@pytest.mark.parametrize(
    ("reference", "expected_code", "expected"),
    [
        ("prep:nothing", EXIT_CONFIG, "prep:nothing returned a list, not a table"),
        ("prep:not_a_function", EXIT_CONFIG, "prep:not_a_function is a int, not a function"),
        ("prep:missing", EXIT_CONFIG, "module prep has no attribute 'missing'"),
        ("prep:boom", EXIT_USER_ERROR, "ValueError: the input has no column 'tenure'"),
        ("nosuch:fn", EXIT_USER_ERROR, "No module named 'nosuch'"),
    ],
)
def test_failures_map_to_exit_codes_and_say_why(
    tmp_path: Path, reference: str, expected_code: int, expected: str
) -> None:
    code, _out, err = run_transform(tmp_path, reference)
    assert code == expected_code, err
    assert expected in err
    assert not dataset_files(tmp_path / "output")


def test_params_are_key_value_strings() -> None:
    assert parse_params(["rows=5", "min-spend=1.5", "note=a=b"]) == {
        "rows": "5",
        "min_spend": "1.5",
        "note": "a=b",
    }
    with pytest.raises(InvalidInput, match="'rows' is not key=value"):
        parse_params(["rows"])


def test_metrics_files_that_are_not_finite_numbers_are_refused(tmp_path: Path) -> None:
    write_metrics(tmp_path, {"accuracy": 0.75, "rows": 10})
    assert read_metrics(tmp_path) == {"accuracy": 0.75, "rows": 10.0}
    for content, message in [
        ("not json", "is not JSON"),
        ("[1, 2]", "holds a list, not an object"),
        ('{"accuracy": "high"}', "metric 'accuracy' is 'high', not a number"),
        ('{"ok": true}', "metric 'ok' is True, not a number"),
        ('{"loss": NaN}', "metric 'loss' is nan, not a finite number"),
        ('{"loss": {"a": 1}}', "not a number"),
        (json.dumps({f"m{i}": i for i in range(300)}), "300 metrics, more than 256"),
    ]:
        (tmp_path / "metrics.json").write_text(content)
        with pytest.raises(InvalidInput, match=message):
            read_metrics(tmp_path)
    (tmp_path / "metrics.json").unlink()
    assert read_metrics(tmp_path) == {}


# -- the example transform -----------------------------------------------------------------------


def test_the_example_features_transform_cleans_churn_for_the_task() -> None:
    raw = tabular.churn_table(rows=500, seed=3)
    # what the de-identified view shows (income dropped, pii hashed), with a few bad records
    view = raw.drop_columns(["income", "email", "age"])
    spend = view.column("monthly_spend").to_pylist()
    spend[0], spend[1] = None, 9_999.0  # a missing value and an outlier
    calls = view.column("support_calls").to_pylist()
    calls[2] = 250
    view = view.set_column(
        view.schema.get_field_index("monthly_spend"), "monthly_spend", pa.array(spend)
    )
    view = view.set_column(
        view.schema.get_field_index("support_calls"), "support_calls", pa.array(calls, pa.int64())
    )
    ctx = DataContext(WorkerEnv())
    ctx._tables[tabular.DATASET] = view

    table = tabular.features(ctx)

    assert tuple(table.column_names) == tabular.KEPT
    assert table.num_rows == 499  # the row missing its spend is gone
    assert all(column.null_count == 0 for column in table.columns)
    for name, (low, high) in tabular.BOUNDS.items():
        values = table.column(name).to_pylist()
        assert low <= min(values) and max(values) <= high, name
        assert table.schema.field(name).type == view.schema.field(name).type  # types kept
    assert table.column("monthly_spend")[0].as_py() == 150.0  # the outlier, clipped
    assert table.column("support_calls")[1].as_py() == 10

    # the churn task trains on the derived dataset by name
    trained = DataContext(WorkerEnv(), params={"dataset": tabular.FEATURES_DATASET})
    trained._tables[tabular.FEATURES_DATASET] = table
    features, labels = tabular.dataset(trained).tensors
    held_out = sum(1 for i in table.column("customer_id").to_pylist() if i % 5 == 0)
    assert features.shape == (499 - held_out, len(tabular.FEATURES))
    assert len(labels) == 499 - held_out

    missing = DataContext(WorkerEnv())
    missing._tables[tabular.DATASET] = view.drop_columns(["city"])
    with pytest.raises(InvalidInput, match="dataset churn has no column city"):
        tabular.features(missing)
