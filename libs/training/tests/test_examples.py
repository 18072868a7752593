"""The example jobs: each trains to its quality bar in one worker, exports, and ships a job
YAML that validates as the scheduler validates it and names its task."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv
import pytest
import torch

from gantry.core import InvalidInput
from gantry.sched.spec import parse_job
from gantry.training.examples import EXAMPLES, example, tabular, transformer
from gantry.training.examples.__main__ import main
from gantry.training.export import export_model
from gantry.training.task import (
    DataContext,
    Task,
    load_task,
    options_for,
    parse_overrides,
    split_params,
)
from gantry.training.trainer import Trainer, WorkerEnv

NAMES = [e.name for e in EXAMPLES]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # CI runners are small and shared: one torch thread is steadier than two that wait on each
    # other (a CNN step measured 15 ms on one thread, 60 ms on two, on a busy 2-core machine).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def deidentified(table: pa.Table) -> pa.Table:
    """What the default view policy shows of the raw table: pii hashed, sensitive dropped."""
    hashed = {
        name: [hashlib.sha256(str(v).encode()).hexdigest() for v in table.column(name).to_pylist()]
        for name in ("email", "age")
    }
    table = table.drop_columns(["income"])
    for name, values in hashed.items():
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
    return table


def train(
    name: str, *, tables: Mapping[str, Any] | None = None, **overrides: Any
) -> tuple[Task, dict[str, float]]:
    """Train example ``name`` as its YAML configures it (plus ``overrides``) in one worker;
    the task and its evaluation."""
    job = parse_job(example(name).job_yaml())
    task = load_task(job.spec.entrypoint.task)
    args = parse_overrides(job.spec.entrypoint.args)
    options = options_for(task, job.spec, {**args, **overrides})
    env = WorkerEnv()
    ctx = DataContext(env, job.spec, options.seed)
    ctx._tables.update(tables or {})
    trainer = Trainer(task.model, task.loss, lambda: task.dataset(ctx), options=options, env=env)
    with trainer:
        trainer.fit()
        module = trainer.state.module.eval()
        metrics = dict(task.evaluate(module, ctx)) if task.evaluate else {}
    return task, metrics


def test_tabular_beats_the_majority_class_on_held_out_customers() -> None:
    table = deidentified(tabular.churn_table(rows=6_000, seed=11))
    _, metrics = train("tabular", tables={tabular.DATASET: table})
    assert metrics["eval_rows"] == 1_200  # every 5th customer id
    assert 0.6 < metrics["majority_rate"] < 0.85
    assert metrics["accuracy"] >= metrics["majority_rate"] + 0.05, metrics


def test_tabular_reads_only_columns_the_deidentified_view_keeps() -> None:
    table = deidentified(tabular.churn_table(rows=100))
    assert "income" not in table.column_names
    assert set(tabular.FEATURES) <= set(table.column_names)
    ctx = DataContext(WorkerEnv(), None)
    ctx._tables[tabular.DATASET] = table
    features, labels = tabular.dataset(ctx).tensors
    assert features.shape == (80, len(tabular.FEATURES))
    assert labels.dtype == torch.long


def test_cnn_reaches_90_percent_held_out_accuracy() -> None:
    _, metrics = train("cnn", epochs=4)  # half the job's epochs, one worker
    assert metrics["accuracy"] >= 0.9, metrics


def test_cnn_declares_image_augmentation() -> None:
    assert example("cnn").job_yaml()  # the shipped file is there
    task = load_task(example("cnn").task)
    assert task.options["augment"] == {"image": {"crop": 28, "padding": 2, "flip": 0.5}}


def test_transformer_perplexity_is_far_below_the_unigram_baseline() -> None:
    _, metrics = train("transformer", max_steps=120)
    assert metrics["unigram_perplexity"] > 15
    assert metrics["perplexity"] < metrics["unigram_perplexity"] / 4, metrics


def test_transformer_text_is_fixed_and_within_its_alphabet() -> None:
    text = transformer.corpus()
    assert len(text) == transformer.CORPUS_CHARS
    assert set(text) <= set(transformer.ALPHABET)
    assert (
        hashlib.sha256(text.encode()).hexdigest()
        == hashlib.sha256(
            transformer._corpus(transformer.CORPUS_CHARS, transformer.CORPUS_SEED).encode()
        ).hexdigest()
    )
    assert transformer.decode(transformer.encode(text[:200])) == text[:200]


def test_the_transformer_advertises_itself_as_generative() -> None:
    assert transformer.task.generation == {
        "vocabulary": transformer.ALPHABET,
        "context": transformer.CONTEXT,
    }
    assert all(load_task(example(n).task).generation is None for n in NAMES if n != "transformer")


@pytest.mark.parametrize("name", NAMES)
def test_each_model_exports_with_a_dynamic_batch(name: str, tmp_path: Path) -> None:
    task = load_task(example(name).task)
    model = task.model().eval()
    assert task.example_input is not None
    artifact, fmt, signature = export_model(model, task.example_input(), tmp_path)
    assert (fmt, artifact) == ("torch.export", "model.pt2")
    assert signature["inputs"][0]["shape"][0] == -1


@pytest.mark.parametrize("name", NAMES)
def test_each_yaml_is_a_valid_job_naming_its_task(name: str) -> None:
    item = example(name)
    job = parse_job(item.job_yaml())
    assert job.kind == "TrainingJob"
    assert job.api_version == "gantry/v1"
    assert job.metadata.name == f"example-{name}"
    assert job.spec.entrypoint.task == item.task == f"gantry.training.examples.{name}:task"
    assert job.spec.replicas in (1, 2)
    assert job.spec.resources.gpus == 0
    assert job.spec.resources.gpu_milli == 0
    task = load_task(job.spec.entrypoint.task)
    rest, params = split_params(job.spec.entrypoint.args, task.params)
    options = options_for(task, job.spec, parse_overrides(rest))
    assert options.precision == job.spec.training.precision
    assert set(params) == set(task.params)


def test_sequences_parameters_slow_or_lengthen_one_rank() -> None:
    from gantry.training.examples.sequences import Sequences, task
    from gantry.training.task import DataContext
    from gantry.training.trainer import WorkerEnv

    args = ["max_steps=50", "slow_rank=1", "slow_ms=0.5", "long_rank=0", "long_factor=3"]
    rest, params = split_params(args, task.params)
    assert rest == ["max_steps=50"]
    assert params["slow_rank"] == 1 and params["slow_ms"] == 0.5 and params["long_factor"] == 3
    zero = task.dataset(DataContext(WorkerEnv(rank=0, world_size=2), params=params))
    one = task.dataset(DataContext(WorkerEnv(rank=1, world_size=2), params=params))
    assert isinstance(zero, Sequences) and isinstance(one, Sequences)
    assert (zero.length, zero.delay_s) == (96, 0.0)
    assert (one.length, one.delay_s) == (32, 0.0005)
    x, y = zero[3]
    assert x.shape == (96, 16) and y.shape == (1,)
    with pytest.raises(InvalidInput, match=r"slow_ms=.fast. is not a valid float"):
        split_params(["slow_ms=fast"], task.params)


def test_the_tabular_job_reads_churn_de_identified() -> None:
    job = parse_job(example("tabular").job_yaml())
    assert [(d.dataset, d.view) for d in job.spec.data] == [("churn", "deidentified")]


def test_the_cli_lists_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    for item in EXAMPLES:
        assert item.name in out
        assert item.summary in out


def test_the_cli_prints_a_job_and_pins_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cnn"]) == 0
    assert parse_job(capsys.readouterr().out).metadata.name == "example-cnn"
    assert main(["tabular", "--version", "0123456789ab"]) == 0
    job = parse_job(capsys.readouterr().out)
    assert job.spec.data[0].version == "0123456789ab"  # quoted: all-digit ids stay strings


def test_the_cli_refuses_what_it_cannot_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["resnet"]) == 2
    err = capsys.readouterr().err
    assert "there is no example 'resnet'" in err
    assert "tabular, cnn, transformer" in err
    assert main(["cnn", "--version", "0123456789ab"]) == 2
    assert "reads no dataset" in capsys.readouterr().err
    assert main(["tabular", "--version", "head!"]) == 2
    assert "is not a version id" in capsys.readouterr().err
    assert main(["transformer", "--data", "somewhere"]) == 2
    assert "needs no data" in capsys.readouterr().err


def test_the_cli_writes_the_tabular_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tabular", "--data", str(tmp_path)]) == 0
    assert "gantry data create churn --schema" in capsys.readouterr().err
    table = pyarrow.csv.read_csv(tmp_path / "churn.csv")
    assert table.num_rows == 20_000
    schema = (tmp_path / "churn.schema.yaml").read_text()
    for name in table.column_names:
        assert f"name: {name}," in schema
