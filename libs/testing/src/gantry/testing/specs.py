"""Documents the whole-platform tests and benchmarks submit: a churn release pipeline and a
small CPU training job (real example tasks of ``gantry.training.examples``)."""

from __future__ import annotations

import textwrap

_CHURN_PIPELINE = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: Pipeline
    metadata: {{name: {name}}}
    spec:
      params:
        min_accuracy: 0.5
      steps:
        - name: preprocess
          data:
            commit: churn-features
            resources: {{cpus: 0.5, memory: 1Gi}}
            entrypoint: {{transform: "gantry.training.examples.tabular:features"}}
            data: [{{dataset: churn, version: "{version}"}}]
        - name: train
          train:
            replicas: 2
            resources: {{cpus: 0.5, memory: 1Gi}}
            entrypoint:
              task: gantry.training.examples.tabular:task
              args: ["epochs=2", "dataset=churn-features"]
            data: [{{dataset: churn-features, version: "${{steps.preprocess.outputs.version}}"}}]
        - name: evaluate
          evaluate:
            model: ${{steps.train.outputs.model}}
            resources: {{cpus: 0.5, memory: 1Gi}}
            entrypoint:
              task: gantry.training.examples.tabular:task
              args: ["dataset=churn-features"]
            data: [{{dataset: churn-features, version: "${{steps.preprocess.outputs.version}}"}}]
        - name: deploy
          gate:
            metric: ${{steps.evaluate.outputs.metrics.accuracy}}
            atLeast: ${{params.min_accuracy}}
          deploy:
            deployment: {name}
            model: ${{steps.evaluate.outputs.model}}
            canary: {{percent: 20}}
    """
)

_SMALL_JOB = textwrap.dedent(
    """\
    apiVersion: gantry/v1
    kind: TrainingJob
    metadata:
      name: {name}
    spec:
      replicas: 1
      resources: {{gpus: 0, cpus: 0.5, memory: 1Gi}}
      entrypoint:
        task: gantry.training.examples.sequences:task
        args: [max_steps={steps}]
      maxRuntime: 5m
    """
)


def churn_pipeline(name: str, version: str) -> str:
    """Pipeline ``name``: preprocess ``churn@version`` into ``churn-features``, train (2
    workers), evaluate, and — its gate open (accuracy at least the ``min_accuracy`` parameter,
    0.5) — deploy to the deployment ``name`` with a 20 % canary."""
    return _CHURN_PIPELINE.format(name=name, version=version)


def small_training_job(name: str, steps: int = 40) -> str:
    """A one-worker CPU training job of ``steps`` steps (a few seconds)."""
    return _SMALL_JOB.format(name=name, steps=steps)


__all__ = ["churn_pipeline", "small_training_job"]
