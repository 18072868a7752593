"""Run-time prediction from similar jobs' history (no oracle)."""

from __future__ import annotations

from gantry.sched.predict import DurationPredictor, JobFeatures, name_pattern, size_bucket


def job(name: str = "bert-ft-0001", user: str = "ann", queue: str = "nlp", gpus: int = 8,
        max_s: float = float("inf")) -> JobFeatures:  # fmt: skip
    return JobFeatures(user, queue, name, gpus * 1000, max_s)


def test_name_patterns_and_size_buckets() -> None:
    assert name_pattern("bert-ft-0042") == name_pattern("BERT-ft-7") == "bert-ft-#"
    assert name_pattern("run-3f2a9c81d0") == "run-#"
    assert [size_bucket(m) for m in (0, 500, 1000, 2000, 8000)] == [0, 0, 1, 2, 4]


def test_prediction_uses_the_most_specific_history_with_enough_runs() -> None:
    p = DurationPredictor(min_samples=3)
    assert p.predict(job()) == 3600.0  # the prior
    for d in (100, 110, 5000):  # one odd run does not swing the median
        p.observe(job("bert-ft-0009"), d)
    assert p.predict(job("bert-ft-0010")) == 110
    # another user's same-named job falls back to the queue level (3 runs of ann's)
    assert p.predict(job(user="bob")) == 110
    for d in (7000, 7100, 7200):
        p.observe(job("resnet-1", user="bob", queue="cv", gpus=1), d)
    assert p.predict(job("resnet-2", user="bob", queue="cv", gpus=1)) == 7100
    # never longer than the job's own limit
    assert p.predict(job("resnet-3", user="bob", queue="cv", gpus=1, max_s=600)) == 600


def test_predicted_service_orders_by_gpu_time() -> None:
    p = DurationPredictor(min_samples=1)
    p.observe(job("small-1", gpus=1), 60)
    p.observe(job("wide-1", gpus=8), 60)
    assert p.predicted_service(job("small-2", gpus=1)) < p.predicted_service(job("wide-2", gpus=8))
    assert p.predicted_service(job("cpu-1", gpus=0)) > 0
