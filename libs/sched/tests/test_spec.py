"""The TrainingJob spec: valid documents parse; every bad field is named with what is allowed."""

from __future__ import annotations

import pytest

from gantry.core import InvalidInput
from gantry.sched.spec import Topology, parse_duration_s, parse_job, parse_memory_mib

GOOD = """
apiVersion: gantry/v1
kind: TrainingJob
metadata: {name: resnet-ft, queue: vision, priority: high, labels: {team: cv}, requestId: r-1}
spec:
  replicas: 4
  minReplicas: 2
  resources: {gpus: 1, gpuModels: [A100, V100M32], cpus: 8, memory: 32Gi, gpuMemory: 40Gi}
  topology: spread
  entrypoint: {module: train, args: [--epochs, "3"]}
  data: [{dataset: customers, version: 3f2a9c81d0e4, view: deidentified}]
  training: {precision: bf16, gradientAccumulation: 4, compression: powersgd,
             checkpointInterval: 10m, privacy: {epsilon: 8}}
  maxRuntime: 24h
"""


def test_a_full_job_parses_with_units_and_defaults() -> None:
    job = parse_job(GOOD)
    assert job.metadata.priority_value == 1000 and job.metadata.request_id == "r-1"
    r = job.spec.resources
    assert (r.gpus, r.cpu_milli, r.memory_mib, r.gpu_memory_mib) == (1, 8000, 32768, 40960)
    assert r.milli_gpus == 1000 and r.gpu_models == ("A100", "V100M32")
    assert job.spec.elastic and job.spec.topology is Topology.SPREAD
    assert job.spec.training.checkpoint_interval_s == 600 and job.spec.max_runtime_s == 86400
    assert job.spec.training.privacy is not None and job.spec.training.privacy.delta == 1e-5
    minimal = parse_job(
        {"apiVersion": "gantry/v1", "kind": "TrainingJob", "metadata": {"name": "x"},
         "spec": {"entrypoint": {"command": ["python", "-c", "1"]}}}
    )  # fmt: skip
    assert minimal.metadata.queue == "default" and minimal.spec.resources.milli_gpus == 0
    assert not minimal.spec.elastic


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            "resources: {gpus: -1}",
            "spec.resources.gpus: Input should be greater than or equal to 0",
        ),
        ("resources: {gpus: 2, gpuMilli: 500}", "gpuMilli shares ONE GPU"),
        ("resources: {gpuMilli: 1500}", "spec.resources.gpuMilli"),
        ("resources: {memory: lots}", "spec.resources.memory: 'lots' is not a quantity"),
        ("minReplicas: 9", "minReplicas (9) exceeds replicas (4)"),
        ("topology: diagonal", "spec.topology"),
        ("maxRuntime: forever", "spec.maxRuntime: 'forever' is not a duration"),
        ("gpus: 1", "spec.gpus: is not a known field"),
        ("training: {precision: fp8}", "spec.training.precision"),
        ("data: [{dataset: a, version: b, view: raw}, {dataset: c, version: d}]", "one view"),
    ],
)
def test_bad_fields_are_named(change: str, expected: str) -> None:
    doc = GOOD.replace("  replicas: 4\n", f"  replicas: 4\n  {change}\n")
    doc = doc.replace("  minReplicas: 2\n", "") if change.startswith("minReplicas") else doc
    if change.startswith(("resources", "topology", "maxRuntime", "training", "data")):
        key = change.split(":")[0]
        lines = [
            ln for ln in doc.splitlines() if not ln.startswith(f"  {key}:") or ln == f"  {change}"
        ]
        if key == "training":
            lines = [ln for ln in lines if "checkpointInterval" not in ln]
        doc = "\n".join(lines)
    with pytest.raises(InvalidInput) as err:
        parse_job(doc)
    assert expected in str(err.value), str(err.value)
    assert "docs/jobs.md" in str(err.value)


def test_document_level_errors() -> None:
    for text, expected in [
        ("[1, 2]", "must be a mapping"),
        ("a: [", "not valid YAML"),
        (GOOD.replace("gantry/v1", "gantry/v2"), "apiVersion"),
        (GOOD.replace("name: resnet-ft", "name: Resnet_FT"), "metadata.name: must be 1-63"),
        (GOOD.replace("priority: high", "priority: urgent"), "unknown priority class 'urgent'"),
    ]:
        with pytest.raises(InvalidInput) as err:
            parse_job(text)
        assert expected in str(err.value), (text, str(err.value))


def test_quantities_and_durations() -> None:
    assert parse_memory_mib("512Mi") == 512 and parse_memory_mib("1.5Gi") == 1536
    assert parse_memory_mib(1 << 30) == 1024 and parse_memory_mib("2G") == 1907
    assert parse_duration_s("90s") == 90 and parse_duration_s("2d") == 172800
    for bad in ("", "12 parsecs", True):
        with pytest.raises(ValueError):
            parse_memory_mib(bad)


def _job(spec: str) -> str:
    return "apiVersion: gantry/v1\nkind: TrainingJob\nmetadata: {name: j}\nspec:\n" + "".join(
        f"  {line}\n" for line in spec.strip().splitlines()
    )


def test_an_evaluation_a_data_job_and_an_input_model_for_any_entrypoint_parse() -> None:
    evaluation = parse_job(
        _job("""
entrypoint: {task: "churn:task", mode: evaluate}
model: {name: churn-classifier, version: 3}
data: [{dataset: churn, version: 63bbc8a0fad4}]
""")
    ).spec
    assert evaluation.entrypoint.mode == "evaluate" and evaluation.entrypoint.kind == "task"
    assert evaluation.model is not None
    assert (evaluation.model.name, evaluation.model.version) == ("churn-classifier", 3)
    assert evaluation.output is None

    data_job = parse_job(
        _job("""
entrypoint: {transform: "gantry.training.examples.tabular:features"}
data: [{dataset: churn, version: 63bbc8a0fad4}]
output: {dataset: churn-features, message: cleaned}
""")
    ).spec
    assert data_job.entrypoint.kind == "transform" and data_job.entrypoint.mode == "train"
    assert data_job.output is not None
    assert (data_job.output.dataset, data_job.output.message) == ("churn-features", "cleaned")

    scripted = parse_job(
        _job("""
entrypoint: {command: [python, score.py]}
model: {name: churn-classifier, version: 1}
output: {dataset: scores}
""")
    ).spec
    assert scripted.entrypoint.kind == "command" and scripted.model is not None
    assert scripted.output is not None and scripted.output.message == ""
    # what the scheduler sends the agents keeps the YAML names
    dumped = scripted.model_dump(mode="json", by_alias=True)
    assert dumped["model"] == {"name": "churn-classifier", "version": 1}
    assert dumped["output"] == {"dataset": "scores", "message": ""}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            'entrypoint: {task: "churn:task", mode: evaluate}',
            "spec.model: an entrypoint with mode: evaluate needs the model to evaluate",
        ),
        (
            "entrypoint: {module: score, mode: evaluate}\nmodel: {name: m, version: 1}",
            "spec.entrypoint.mode: mode 'evaluate' applies to task entrypoints only",
        ),
        ('entrypoint: {task: "churn:task", mode: predict}', "spec.entrypoint.mode: Input should"),
        (
            'entrypoint: {task: "churn:task"}\nmodel: {name: m, version: 0}',
            "spec.model.version: Input should be greater than or equal to 1",
        ),
        (
            'entrypoint: {task: "churn:task"}\nmodel: {name: m}',
            "spec.model.version: Field required",
        ),
        (
            'entrypoint: {transform: "t:f"}',
            "spec.output: a transform entrypoint commits its table as a dataset version",
        ),
        (
            'entrypoint: {transform: "t:f"}\noutput: {dataset: d}\nreplicas: 2',
            "spec.replicas: a transform runs in one worker",
        ),
        (
            'entrypoint: {task: "t:t", mode: evaluate}\nmodel: {name: m, version: 1}\nreplicas: 4',
            "spec.replicas: an evaluation runs in one worker",
        ),
        ('entrypoint: {transform: "t:f"}\noutput: {dataset: ../etc}', "spec.output.dataset:"),
        ("entrypoint: {transform: not-a-ref}\noutput: {dataset: d}", "spec.entrypoint.transform"),
        (
            'entrypoint: {transform: "t:f", module: m}\noutput: {dataset: d}',
            "spec.entrypoint: give exactly one of task",
        ),
        (
            'entrypoint: {task: "churn:task"}\noutput: {dataset: d, branch: main}',
            "spec.output.branch: is not a known field",
        ),
    ],
)
def test_bad_job_kinds_are_named_with_their_field(spec: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_job(_job(spec))
    assert expected in str(err.value), str(err.value)
