"""Example job: a churn classifier on a governed table, read in the de-identified view.

The job reads the dataset ``churn`` -- a CRM-like table with personal data -- through the
job's grant, so the worker sees only what the de-identified view shows: under the default
view policy ``email`` and ``age`` (pii) arrive hashed, ``income`` (sensitive) not at all.
The model uses the four numeric columns that survive unchanged (internal business data) and
predicts ``churned``::

    tenure_months  monthly_spend  support_calls  late_payments   ->   churned

Every fifth customer (``customer_id % 5 == 0``) is held out: the split depends on the ids, not
on the order the shards arrive in, so every run and every worker agrees on it. ``evaluate``
reports the held-out accuracy next to the majority-class rate (what always answering "stays"
scores); a model that learned something is clearly above it.

The table is synthetic (:func:`churn_table`); ``python -m gantry.training.examples tabular
--data DIR`` writes it as a CSV with its schema file, ready for ``gantry data create`` and
``gantry data upload``.

:func:`features` is the matching data job's transform: it reads ``churn`` de-identified and
returns the training columns cleaned (rows missing a value dropped, outliers clipped), to be
committed as a version of ``churn-features`` (:data:`FEATURES_SCHEMA_YAML`). The task trains on
that dataset instead with ``args: [dataset=churn-features]`` -- a preprocess -> train
pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from gantry.core import InvalidInput
from gantry.training import DataContext, Task

DATASET = "churn"
FEATURES_DATASET = "churn-features"
"""The derived dataset :func:`features` writes (a data steward creates it first)."""
LABEL = "churned"
FEATURES = ("tenure_months", "monthly_spend", "support_calls", "late_payments")
KEPT = ("customer_id", "city", *FEATURES, LABEL)
"""The columns of ``churn-features``: no personal data, everything the task trains on."""
BOUNDS = {
    "tenure_months": (1, 72),
    "monthly_spend": (15.0, 150.0),
    "support_calls": (0, 10),
    "late_payments": (0, 6),
}
"""Where :func:`features` clips each feature: the plausible range of a customer record."""
HOLDOUT_EVERY = 5
"""Customers whose id is a multiple of this are held out for evaluation (20 %)."""

# Where the features sit and how far they spread in the generated table. The model
# standardises its own inputs with them, so the exported model takes the columns as stored.
_CENTER = (36.5, 65.0, 1.5, 0.5)
_SPREAD = (20.8, 24.5, 1.22, 0.71)

#: The dataset's schema file for ``gantry data create churn --schema churn.schema.yaml``.
SCHEMA_YAML = """\
# churn.schema.yaml: the example table. Under the default view policy the de-identified
# view keeps public and internal columns, hashes pii and drops sensitive ones.
columns:
  - {name: customer_id,   type: int64,   class: internal, nullable: false}
  - {name: email,         type: string,  class: pii}
  - {name: age,           type: int64,   class: pii}
  - {name: income,        type: float64, class: sensitive}
  - {name: city,          type: string,  class: public}
  - {name: tenure_months, type: int64,   class: internal}
  - {name: monthly_spend, type: float64, class: internal}
  - {name: support_calls, type: int64,   class: internal}
  - {name: late_payments, type: int64,   class: internal}
  - {name: churned,       type: bool,    class: public}
"""

#: The schema file of the derived dataset, for ``gantry data create churn-features``.
FEATURES_SCHEMA_YAML = """\
# churn-features.schema.yaml: the cleaned training columns of churn (no personal data),
# written by the transform gantry.training.examples.tabular:features.
columns:
  - {name: customer_id,   type: int64,   class: internal, nullable: false}
  - {name: city,          type: string,  class: public}
  - {name: tenure_months, type: int64,   class: internal, nullable: false}
  - {name: monthly_spend, type: float64, class: internal, nullable: false}
  - {name: support_calls, type: int64,   class: internal, nullable: false}
  - {name: late_payments, type: int64,   class: internal, nullable: false}
  - {name: churned,       type: bool,    class: public,   nullable: false}
"""

_CITIES = ("Oslo", "Lima", "Pune", "Accra", "Kyoto", "Quito")


def churn_table(rows: int = 20_000, seed: int = 7) -> Any:
    """The raw example table (a ``pyarrow.Table``), the same for the same arguments.

    ``churned`` is drawn from a logistic model of tenure, spend, support calls, late payments
    and income: about 26 % of customers churn, and the best possible accuracy from the four
    de-identified features is about 0.85.
    """
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    tenure = rng.integers(1, 73, rows)
    spend = np.clip(rng.normal(65.0, 25.0, rows), 15.0, 150.0).round(2)
    calls = rng.poisson(1.5, rows)
    late = rng.poisson(0.5, rows)
    income = rng.lognormal(10.7, 0.45, rows).round(2)
    age = rng.integers(18, 80, rows)
    logit = (
        -2.0
        - 0.09 * (tenure - 36)
        + 0.04 * (spend - 65)
        + 1.0 * (calls - 1.5)
        + 1.4 * (late - 0.5)
        - 0.5 * np.log(income / 45_000)
    )
    churned = rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))
    ids = np.arange(200_000, 200_000 + rows, dtype=np.int64)
    return pa.table(
        {
            "customer_id": pa.array(ids, pa.int64()),
            "email": [f"customer{i}@example.com" for i in ids],
            "age": pa.array(age, pa.int64()),
            "income": pa.array(income, pa.float64()),
            "city": [_CITIES[i] for i in rng.integers(0, len(_CITIES), rows)],
            "tenure_months": pa.array(tenure, pa.int64()),
            "monthly_spend": pa.array(spend, pa.float64()),
            "support_calls": pa.array(calls, pa.int64()),
            "late_payments": pa.array(late, pa.int64()),
            "churned": pa.array(churned, pa.bool_()),
        }
    )


class Standardize(nn.Module):
    """``(x - center) / spread`` with fixed, saved constants (buffers, not parameters)."""

    center: torch.Tensor
    spread: torch.Tensor

    def __init__(self, center: tuple[float, ...], spread: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("center", torch.tensor(center))
        self.register_buffer("spread", torch.tensor(spread))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The standardised features."""
        return (x - self.center) / self.spread


def model() -> nn.Module:
    """A small MLP: four raw features in, two class logits (stays, churns) out."""
    return nn.Sequential(
        Standardize(_CENTER, _SPREAD),
        nn.Linear(len(FEATURES), 32),
        nn.ReLU(),
        nn.Linear(32, 32),
        nn.ReLU(),
        nn.Linear(32, 2),
    )


def features(ctx: DataContext) -> Any:
    """The training columns of the job's ``churn`` input (``source=NAME`` reads another),
    cleaned: the columns of :data:`KEPT` (personal data left out), rows missing any of them
    dropped, each feature clipped to its :data:`BOUNDS`. A ``pyarrow.Table`` for the data
    job's ``output`` (``churn-features``)."""
    import pyarrow.compute as pc

    source = str(ctx.params.get("source", DATASET))
    table = ctx.table(source)
    missing = [name for name in KEPT if name not in table.column_names]
    if missing:
        raise InvalidInput(
            f"dataset {source} has no column {', '.join(missing)}",
            hint=f"its columns: {', '.join(table.column_names)}",
        )
    table = table.select(list(KEPT)).drop_null()
    for name, (low, high) in BOUNDS.items():
        column = table.column(name)
        clipped = pc.min_element_wise(pc.max_element_wise(column, low), high)
        table = table.set_column(
            table.schema.get_field_index(name), name, clipped.cast(column.type)
        )
    return table


def _split(ctx: DataContext, *, held_out: bool) -> TensorDataset:
    source = str(ctx.params.get("dataset", DATASET))
    data = ctx.tensors(source, label=LABEL, features=FEATURES)
    ids = ctx.table(source).column("customer_id").to_numpy(zero_copy_only=False)
    keep = torch.from_numpy((ids % HOLDOUT_EVERY == 0) == held_out)
    features, labels = data.tensors
    return TensorDataset(features[keep], labels[keep])


def dataset(ctx: DataContext) -> TensorDataset:
    """The training rows: every customer not held out."""
    return _split(ctx, held_out=False)


def evaluate(model: nn.Module, ctx: DataContext) -> Mapping[str, float]:
    """Held-out accuracy and loss, and the majority-class rate to compare the accuracy with."""
    features, labels = _split(ctx, held_out=True).tensors
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(features.to(device)).float().cpu()
    churn_rate = float(labels.float().mean())
    return {
        "accuracy": float((logits.argmax(dim=1) == labels).float().mean()),
        "majority_rate": max(churn_rate, 1.0 - churn_rate),
        "eval_loss": float(nn.functional.cross_entropy(logits, labels)),
        "eval_rows": float(len(labels)),
    }


task = Task(
    model=model,
    loss=nn.functional.cross_entropy,
    dataset=dataset,
    evaluate=evaluate,
    example_input=lambda: torch.tensor([[12.0, 70.0, 2.0, 0.0], [48.0, 40.0, 0.0, 1.0]]),
    options={"epochs": 4, "micro_batch_size": 64, "lr": 3e-3},
    model_name="churn-classifier",
    description="Churn from tenure, spend, support calls and late payments (de-identified).",
    params={"dataset": DATASET},
)
"""The job's task: ``entrypoint: {task: gantry.training.examples.tabular:task}``."""
