"""Pipeline documents: what is accepted, and every kind of bad input refused with its place."""

from __future__ import annotations

import pytest
import yaml

from gantry.core import InvalidInput
from gantry.workflows.pipelines import job_document, parse_pipeline, placeholder
from gantry.workflows.references import Reference, parse_reference, substitute

from .conftest import CHURN


def _edit(source: str, change: object) -> str:
    doc = yaml.safe_load(source)
    change(doc)  # type: ignore[operator]
    return yaml.safe_dump(doc, sort_keys=False)


def _refused(source: str) -> str:
    with pytest.raises(InvalidInput) as info:
        parse_pipeline(source)
    return str(info.value)


def test_the_churn_pipeline_is_accepted_in_dependency_order() -> None:
    p = parse_pipeline(CHURN)
    assert p.order == ("preprocess", "train", "evaluate", "deploy")
    # references make the edges: nobody wrote dependsOn
    assert p.parents["train"] == ("preprocess",)
    assert set(p.parents["evaluate"]) == {"train", "preprocess"}
    assert p.parents["deploy"] == ("evaluate",)
    assert p.downstream("train") == ("evaluate", "deploy")


def test_a_job_document_is_built_with_the_references_resolved() -> None:
    p = parse_pipeline(CHURN)
    values = {"steps.preprocess.outputs.version": "v9", "steps.train.outputs.model": "churn:4"}

    def resolve(ref: Reference) -> object:
        return values.get(ref.text, placeholder(ref, p.params))

    doc = job_document(p, p.step("evaluate"), resolve, run_id="r1")
    assert doc["metadata"]["name"] == "churn-evaluate"
    assert doc["metadata"]["queue"] == "research"
    assert doc["metadata"]["labels"]["gantry.io/run"] == "r1"
    assert doc["spec"]["model"] == {"name": "churn", "version": 4}
    assert doc["spec"]["entrypoint"]["mode"] == "evaluate"
    assert doc["spec"]["data"][0]["version"] == "v9"
    data = job_document(p, p.step("preprocess"), resolve, run_id="r1")
    assert data["spec"]["output"]["dataset"] == "churn-features"
    assert "commit" not in data["spec"]
    train = job_document(p, p.step("train"), resolve, run_id="r1")
    assert train["spec"]["entrypoint"]["args"] == ["epochs=3"]


def test_a_whole_string_reference_keeps_its_type() -> None:
    got = substitute(
        {"n": "${params.n}", "s": "n=${params.n}", "lit": "$${params.n}"},
        lambda ref: 3,
    )
    assert got == {"n": 3, "s": "n=3", "lit": "${params.n}"}


def test_a_cycle_is_refused_with_the_steps_named() -> None:
    def cycle(doc: dict) -> None:  # type: ignore[type-arg]
        doc["spec"]["steps"][0]["dependsOn"] = ["deploy"]

    message = _refused(_edit(CHURN, cycle))
    assert "cycle" in message
    for step in ("preprocess", "train", "evaluate", "deploy"):
        assert step in message


def test_an_unknown_step_output_is_refused_with_what_the_step_has() -> None:
    def bad(doc: dict) -> None:  # type: ignore[type-arg]
        doc["spec"]["steps"][3]["deploy"]["model"] = "${steps.train.outputs.weights}"

    message = _refused(_edit(CHURN, bad))
    assert "spec.steps[3] (deploy).deploy.model" in message
    assert "no output 'weights'" in message
    assert "job, model, metrics.<name>" in message


def test_references_to_missing_steps_and_parameters_are_refused() -> None:
    def bad(doc: dict) -> None:  # type: ignore[type-arg]
        doc["spec"]["steps"][1]["train"]["entrypoint"]["args"] = ["lr=${params.lr}"]
        doc["spec"]["steps"][2]["evaluate"]["model"] = "${steps.training.outputs.model}"

    message = _refused(_edit(CHURN, bad))
    assert "${params.lr} names a parameter spec.params does not declare" in message
    assert "${steps.training.outputs.model} names no step" in message


def test_bad_steps_are_all_reported_at_once() -> None:
    def bad(doc: dict) -> None:  # type: ignore[type-arg]
        steps = doc["spec"]["steps"]
        steps[1]["name"] = "preprocess"  # a duplicate
        steps[2]["evaluate"].pop("model")
        steps[3]["gate"] = {"metric": "${params.epochs}", "atLeast": 1}
        steps.append({"name": "nothing"})

    message = _refused(_edit(CHURN, bad))
    assert "used twice" in message
    assert "evaluate.model: name the model version" in message
    assert "gate.metric: must be a step's metric" in message
    assert (
        "spec.steps[4] (nothing): give exactly one of train, data, evaluate, deploy or experiment"
        in message
    )


def test_an_invalid_job_spec_is_reported_where_it_is() -> None:
    def bad(doc: dict) -> None:  # type: ignore[type-arg]
        doc["spec"]["steps"][1]["train"]["replicas"] = 0
        doc["spec"]["steps"][1]["train"]["colour"] = "blue"

    message = _refused(_edit(CHURN, bad))
    assert "spec.steps[1] (train).train" in message
    assert "replicas" in message and "colour" in message


def test_unknown_fields_and_kinds_are_refused() -> None:
    assert "kind 'Pipe' is not a pipeline" in _refused(
        CHURN.replace("kind: Pipeline", "kind: Pipe")
    )
    message = _refused(CHURN.replace("  queue: research", "  queue: research\n  paralel: 2"))
    assert "spec.paralel: is not a known field" in message
    assert "not valid YAML" in _refused("spec: [")


def test_schedules_belong_to_cron_pipelines_and_must_parse() -> None:
    def cron(expr: str, kind: str = "CronPipeline"):  # type: ignore[no-untyped-def]
        def change(doc: dict) -> None:  # type: ignore[type-arg]
            doc["kind"] = kind
            doc["spec"]["schedule"] = {"cron": expr, "concurrency": "queue"}

        return change

    p = parse_pipeline(_edit(CHURN, cron("0 3 * * *")))
    assert p.schedule is not None and p.schedule.concurrency == "queue"
    assert "five" in _refused(_edit(CHURN, cron("0 3 * *")))
    assert "Bad hour" in _refused(_edit(CHURN, cron("0 25 * * *")))
    assert "kind: CronPipeline" in _refused(_edit(CHURN, cron("0 3 * * *", "Pipeline")))

    def no_schedule(doc: dict) -> None:  # type: ignore[type-arg]
        doc["kind"] = "CronPipeline"

    assert "needs spec.schedule" in _refused(_edit(CHURN, no_schedule))


def test_run_parameters_are_typed_like_their_defaults() -> None:
    p = parse_pipeline(CHURN)
    assert p.run_params({"epochs": "7", "min_accuracy": "0.9"}) == {
        "epochs": 7,
        "min_accuracy": 0.9,
        "source": "0123",
    }
    with pytest.raises(InvalidInput, match="'x' is not a whole number"):
        p.run_params({"epochs": "x"})
    with pytest.raises(InvalidInput, match="unknown parameter 'lr'"):
        p.run_params({"lr": "0.1"})


def test_references_say_what_may_be_written() -> None:
    assert parse_reference("steps.train.outputs.metrics.accuracy").metric == "accuracy"
    with pytest.raises(InvalidInput, match=r"\$\{params.<name>\}"):
        parse_reference("step.train.model")


def test_canary_analysis_is_typed_as_the_serving_api_wants() -> None:
    from gantry.protos.v1 import serving_pb2 as pb
    from gantry.workflows.pipelines import Canary

    analysis = Canary.model_validate(
        {"percent": 20, "stepPercent": 20, "maxPercent": 60, "interval": "2s", "minRequests": 5}
    ).analysis()
    assert analysis == {"step_percent": 20, "max_percent": 60, "interval_s": 2.0, "min_requests": 5}
    pb.CanarySpec(**analysis)  # what the serving client builds from it: raises on a float int
