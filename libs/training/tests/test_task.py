"""What a user writes: loading a Task by reference, task options from args and the spec, the
job spec file, and the data context's datasets."""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import torch

import gantry.training.task
from gantry.core import ConfigError, InvalidInput
from gantry.sched.spec import DataUse, Entrypoint, JobSpec, Privacy, Training
from gantry.training.task import (
    DataContext,
    Task,
    load_task,
    options_for,
    parse_overrides,
    read_spec,
)
from gantry.training.trainer import TrainingOptions, WorkerEnv

_names = itertools.count()


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Writes a module with the given source into a directory on sys.path; its (unique) name.

    Every module written is forgotten again after the test.
    """
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(source: str) -> str:
        name = f"gantry_user_task_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


TASK_SOURCE = """
    import torch
    from torch.utils.data import TensorDataset
    from gantry.training.task import Task

    def model():
        return torch.nn.Linear(4, 1)

    def dataset(ctx):
        return TensorDataset(torch.randn(8, 4), torch.randn(8, 1))

    task = Task(model=model, loss=torch.nn.functional.mse_loss, dataset=dataset,
                options={"epochs": 2})

    def make_task():
        return Task(model=model, loss=torch.nn.functional.mse_loss, dataset=dataset,
                    model_name="made")

    class Holder:
        task = task

    not_a_task = 42

    def returns_junk():
        return "junk"
"""


def spec(**training: object) -> JobSpec:
    return JobSpec(
        entrypoint=Entrypoint(task="pkg.mod:task"),
        training=Training.model_validate(training),
        data=(DataUse(dataset="clicks", version="v3"),),
    )


def test_public_surface_is_pinned() -> None:
    assert sorted(gantry.training.task.__all__) == [
        "DataContext",
        "DatasetFactory",
        "Evaluate",
        "Task",
        "load_reference",
        "load_task",
        "options_for",
        "parse_overrides",
        "read_spec",
        "split_params",
    ]


# -- load_task -----------------------------------------------------------------------------------


@pytest.mark.parametrize("reference", ["no_colon", ":task", "module:", ""])
def test_a_reference_that_is_not_module_colon_attribute_is_refused(reference: str) -> None:
    with pytest.raises(InvalidInput, match="is not module:attribute") as caught:
        load_task(reference)
    assert caught.value.hint is not None and "my_package.train:task" in caught.value.hint


def test_a_task_object_loads(user_module: Callable[[str], str]) -> None:
    name = user_module(TASK_SOURCE)
    task = load_task(f"{name}:task")
    assert isinstance(task, Task)
    assert task.options == {"epochs": 2}
    assert isinstance(task.model(), torch.nn.Linear)


def test_a_function_returning_a_task_is_called(user_module: Callable[[str], str]) -> None:
    name = user_module(TASK_SOURCE)
    assert load_task(f"{name}:make_task").model_name == "made"
    assert load_task(f"{name}:Holder.task").options == {"epochs": 2}  # a dotted attribute


def test_a_missing_attribute_is_invalid_input_with_a_hint(
    user_module: Callable[[str], str],
) -> None:
    name = user_module(TASK_SOURCE)
    with pytest.raises(InvalidInput, match=f"module {name} has no attribute 'tusk'") as caught:
        load_task(f"{name}:tusk")
    assert caught.value.hint is not None and "gantry.training.Task" in caught.value.hint
    with pytest.raises(InvalidInput, match=r"has no attribute 'Holder\.nope'"):
        load_task(f"{name}:Holder.nope")


@pytest.mark.parametrize(("attribute", "kind"), [("not_a_task", "int"), ("returns_junk", "str")])
def test_something_that_is_not_a_task_is_refused(
    user_module: Callable[[str], str], attribute: str, kind: str
) -> None:
    name = user_module(TASK_SOURCE)
    with pytest.raises(InvalidInput, match=f"is a {kind}, not a gantry.training.Task"):
        load_task(f"{name}:{attribute}")


def test_the_users_import_error_propagates_as_it_is(user_module: Callable[[str], str]) -> None:
    name = user_module(
        """
        class DataNotThere(RuntimeError):
            pass

        raise DataNotThere("the user's own failure at import")
        """
    )
    with pytest.raises(RuntimeError, match="the user's own failure at import") as caught:
        load_task(f"{name}:task")
    assert type(caught.value).__name__ == "DataNotThere"  # not wrapped in a Gantry error


def test_a_module_that_does_not_exist_raises_module_not_found() -> None:
    with pytest.raises(ModuleNotFoundError, match="gantry_no_such_module"):
        load_task("gantry_no_such_module:task")


# -- parse_overrides -----------------------------------------------------------------------------


def test_overrides_are_typed() -> None:
    parsed = parse_overrides(
        [
            "epochs=3",
            "micro-batch-size=64",  # dashes as in a command line
            "max_steps=100",
            "seed=7",
            "num_workers=2",
            "lr=0.001",
            "deterministic=yes",
            "fsdp=false",
            'augment={"image": {"flip": 0.5}}',
            "device=cpu",
        ]
    )
    assert parsed == {
        "epochs": 3,
        "micro_batch_size": 64,
        "max_steps": 100,
        "seed": 7,
        "num_workers": 2,
        "lr": 0.001,
        "deterministic": True,
        "fsdp": False,
        "augment": {"image": {"flip": 0.5}},
        "device": "cpu",
    }
    assert parse_overrides([]) == {}
    assert parse_overrides(["fsdp=1", "deterministic=No"]) == {"fsdp": True, "deterministic": False}


@pytest.mark.parametrize(
    "key", ["precision", "compression", "gradient_accumulation", "checkpoint_interval_s",
            "privacy", "optimizer", "epoch"]
)  # fmt: skip
def test_options_the_task_may_not_set_are_refused(key: str) -> None:
    with pytest.raises(InvalidInput, match=f"unknown task option '{key}'") as caught:
        parse_overrides([f"{key}=1"])
    hint = caught.value.hint or ""
    assert "epochs" in hint and "micro_batch_size" in hint
    assert "precision" not in hint.split(";")[0]  # not offered as a usable option
    assert "come from spec.training" in hint


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("epochs", "is not key=value"),
        ("=3", "is not key=value"),
        ("epochs=three", "epochs='three' is not a valid value"),
        ("lr=fast", "lr='fast' is not a valid value"),
        ("fsdp=maybe", "fsdp='maybe' is not a valid value"),
        ("augment={not json", "is not a valid value"),
    ],
)
def test_malformed_overrides_are_refused(arg: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_overrides([arg])


# -- options_for ---------------------------------------------------------------------------------


def task_with(**options: object) -> Task:
    return Task(
        model=lambda: torch.nn.Linear(1, 1),
        loss=torch.nn.functional.mse_loss,
        dataset=lambda ctx: torch.utils.data.TensorDataset(torch.zeros(1, 1)),
        options=options,
    )


def test_without_a_spec_the_task_options_then_the_overrides_apply() -> None:
    task = task_with(epochs=5, lr=0.1, micro_batch_size=8)
    opts = options_for(task, None, {"epochs": 2})
    assert isinstance(opts, TrainingOptions)
    assert (opts.epochs, opts.lr, opts.micro_batch_size) == (2, 0.1, 8)
    # a script run by hand has no spec: the task's own precision is honoured
    assert options_for(task_with(precision="bf16"), None, {}).precision == "bf16"


def test_the_specs_training_fields_win_over_the_task() -> None:
    task = task_with(
        precision="fp16",
        compression="int8",
        gradient_accumulation=8,
        checkpoint_interval_s=5,
        privacy=Privacy(epsilon=9.0),
        epochs=4,
    )
    job = spec(
        precision="bf16",
        gradientAccumulation=2,
        compression="fp16",
        checkpointInterval="15m",
        privacy={"epsilon": 2.0},
    )
    opts = options_for(task, job, {"lr": 0.5})
    assert opts.precision == "bf16"
    assert opts.compression == "fp16"
    assert opts.gradient_accumulation == 2
    assert opts.checkpoint_interval_s == 900
    assert opts.privacy == Privacy(epsilon=2.0)
    assert (opts.epochs, opts.lr) == (4, 0.5)  # what the spec does not own stays the task's
    # a spec without privacy turns the task's off: DP is the spec's decision
    assert options_for(task, spec(), {}).privacy is None
    assert options_for(task, spec(), {}).precision == "fp32"


def test_task_options_that_are_not_training_options_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="task options epoch, speed are not training options"):
        options_for(task_with(epoch=3, speed=1), None, {})


# -- read_spec -----------------------------------------------------------------------------------


def test_without_a_spec_file_there_is_no_spec() -> None:
    assert read_spec({}) == (None, "")
    assert read_spec({"GANTRY_JOB_NAME": "adhoc"}) == (None, "adhoc")


def test_the_spec_is_read_from_the_file_the_agent_writes(tmp_path: Path) -> None:
    document = {
        "name": "ranker",
        "spec": {
            "entrypoint": {"task": "ranker.train:task", "args": ["epochs=2"]},
            "data": [{"dataset": "clicks", "version": "v3"}],
            "training": {"precision": "bf16", "privacy": {"epsilon": 3}},
        },
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(document))

    job, name = read_spec({"GANTRY_JOB_SPEC": str(path), "GANTRY_JOB_NAME": "other"})

    assert name == "ranker"
    assert job is not None
    assert job.entrypoint.task == "ranker.train:task"
    assert job.training.precision == "bf16"
    assert job.training.privacy == Privacy(epsilon=3)
    assert job.data == (DataUse(dataset="clicks", version="v3"),)
    # a bare spec (no wrapper) works too, and the name comes from the environment
    path.write_text(json.dumps(document["spec"]))
    job, name = read_spec({"GANTRY_JOB_SPEC": str(path), "GANTRY_JOB_NAME": "other"})
    assert job is not None and name == "other"


def test_a_missing_or_broken_spec_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the job spec"):
        read_spec({"GANTRY_JOB_SPEC": str(tmp_path / "absent.json")})
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the job spec"):
        read_spec({"GANTRY_JOB_SPEC": str(broken)})
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"spec": {"replicas": 0}}))
    with pytest.raises(ConfigError, match="is not valid"):
        read_spec({"GANTRY_JOB_SPEC": str(invalid)})


# -- DataContext ---------------------------------------------------------------------------------


def test_use_names_the_datasets_the_spec_reads() -> None:
    ctx = DataContext(WorkerEnv(), spec())
    assert ctx.use("clicks") == DataUse(dataset="clicks", version="v3")
    with pytest.raises(InvalidInput, match=r"does not read dataset 'views' \(it reads: clicks\)"):
        ctx.use("views")
    with pytest.raises(InvalidInput, match=r"\(it reads: none\)") as caught:
        DataContext(WorkerEnv()).use("clicks")
    assert caught.value.hint is not None and "spec.data" in caught.value.hint


def clicks_table() -> pa.Table:
    return pa.table(
        {
            "user": pa.array(["a", "b", "c"]),  # not numeric: never a feature
            "age": pa.array([31, 45, 27], pa.int64()),
            "score": pa.array([0.5, 1.5, -2.0], pa.float64()),
            "premium": pa.array([True, False, True]),
            "clicked": pa.array([1, 0, 1], pa.int8()),
        }
    )


def context_with_table() -> DataContext:
    ctx = DataContext(WorkerEnv(), spec())
    ctx._tables["clicks"] = clicks_table()  # what table() keeps after reading via governance
    return ctx


def test_tensors_stack_the_numeric_columns_as_float_features() -> None:
    data = context_with_table().tensors("clicks", label="clicked")

    x, y = data.tensors
    assert x.dtype == torch.float32 and x.shape == (3, 3)
    assert x.tolist() == [[31.0, 0.5, 1.0], [45.0, 1.5, 0.0], [27.0, -2.0, 1.0]]
    assert y.dtype == torch.long and y.tolist() == [1, 0, 1]
    assert len(data) == 3


def test_tensors_with_chosen_features_and_label_dtype() -> None:
    data = context_with_table().tensors(
        "clicks", label="score", features=["age"], label_dtype=torch.float32
    )
    x, y = data.tensors
    assert x.tolist() == [[31.0], [45.0], [27.0]]
    assert y.dtype == torch.float32 and y.tolist() == [0.5, 1.5, -2.0]


def test_tensor_labels_are_a_writable_copy_not_a_view_of_the_table() -> None:
    ctx = context_with_table()
    _, y = ctx.tensors("clicks", label="age", features=["score"]).tensors  # int64: no cast

    y[0] = -1  # e.g. a user's in-place relabelling

    assert ctx.table("clicks").column("age").to_pylist() == [31, 45, 27]


def test_tensors_refuse_missing_columns_and_tables_without_features() -> None:
    ctx = context_with_table()
    with pytest.raises(InvalidInput, match="no column 'label'") as caught:
        ctx.tensors("clicks", label="label")
    assert caught.value.hint is not None and "clicked" in caught.value.hint
    with pytest.raises(InvalidInput, match="no column 'height'"):
        ctx.tensors("clicks", label="clicked", features=["age", "height"])
    ctx._tables["clicks"] = pa.table({"user": ["a"], "clicked": [1]})
    with pytest.raises(InvalidInput, match="no numeric feature columns"):
        ctx.tensors("clicks", label="clicked")


def test_table_refuses_a_dataset_the_spec_does_not_read_before_any_network_use() -> None:
    with pytest.raises(InvalidInput, match="does not read dataset 'views'"):
        context_with_table().table("views")
