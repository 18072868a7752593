"""What a job takes in and what it leaves, on the agent's side.

Before the workers start: the input model its spec names (``spec.model``), downloaded from the
registry into ``<job dir>/model`` for ``GANTRY_MODEL_DIR``. Once the workers of rank 0's node
have exited 0, from ``$GANTRY_OUTPUT_DIR``: the metrics rank 0 wrote (``metrics.json``), the
model it exported (registered), and the Parquet files of a data job (``spec.output``,
committed as a dataset version). Governance decides each for the job's owner
(:mod:`gantry.training_agent.governance`). A refusal to register or commit is
:class:`OutputRefused`, which fails the job with its text; a bad metrics file is only noted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gantry.core import GantryError, Unavailable
from gantry.events.catalog import JobScheduled
from gantry.training.outputs import DATASET_DIR, read_metrics
from gantry.training_agent.governance import GovernanceLink
from gantry.training_agent.launch import input_model, output_dataset

#: A line of the agent's own in the job's log.
Note = Callable[[str], None]


class OutputRefused(Exception):
    """What the job left could not be registered or committed: the job fails with ``text``
    (its files are kept, and ``text`` says where)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


async def fetch_input_model(
    governance: GovernanceLink, job: JobScheduled, job_dir: Path, note: Note
) -> Path | None:
    """Download the model version the spec names into ``<job_dir>/model``; its directory, or
    None when the spec names none. Any failure is a :class:`GantryError` naming the model."""
    wanted = input_model(job.spec)
    if wanted is None:
        return None
    name, version = wanted
    if not governance.known():
        raise Unavailable(
            f"the input model {name}:{version} cannot be downloaded: no governance service is "
            "configured (GANTRY_AGENT__GOVERNANCE_ADDR)"
        )
    into = job_dir / "model"
    try:
        got = await governance.download_model(job, name, version, into)
    except GantryError as exc:
        raise GantryError(
            f"the input model {name}:{version} could not be downloaded: {exc.message}",
            hint=exc.hint,
        ) from exc
    note(f"downloaded model {got} into {into} (GANTRY_MODEL_DIR)")
    return into


def job_metrics(output_dir: Path, note: Note) -> dict[str, float]:
    """The metrics rank 0 wrote; {} for none, and for a malformed file (noted)."""
    try:
        return read_metrics(output_dir)
    except GantryError as exc:
        note(f"metrics not reported: {exc.message}")
        return {}


async def register_model(
    governance: GovernanceLink, job: JobScheduled, output_dir: Path, note: Note
) -> str:
    """Register the model rank 0 exported; "name:version", or "" when there is none (or no
    governance to register it with: noted, the model is kept)."""
    if not governance.known():
        if (output_dir / "model.json").exists():
            note(
                "model not registered: no governance service is configured "
                f"(GANTRY_AGENT__GOVERNANCE_ADDR); it is kept in {output_dir}"
            )
        return ""
    try:
        model = await governance.register_model(job, output_dir) or ""
    except GantryError as exc:
        raise OutputRefused(
            f"training finished but the model could not be registered: {exc.message}"
            f"; the exported model is kept in {output_dir}"
        ) from exc
    if model:
        note(f"registered model {model} with lineage to job {job.job_id}")
    return model


async def commit_output(
    governance: GovernanceLink, job: JobScheduled, output_dir: Path, note: Note
) -> str:
    """Commit the job's Parquet files as a version of its ``spec.output`` dataset;
    "dataset@version", or "" when the spec has no output."""
    try:
        output = output_dataset(job.spec)
    except GantryError as exc:
        raise OutputRefused(f"the job's output cannot be committed: {exc.message}") from exc
    if output is None:
        return ""
    dataset, message = output
    kept = output_dir / DATASET_DIR
    if not governance.known():
        raise OutputRefused(
            f"the job finished but its output was not committed to {dataset}: no governance "
            f"service is configured (GANTRY_AGENT__GOVERNANCE_ADDR); the files are kept in {kept}"
        )
    try:
        version = await governance.commit_output(job, dataset, message, output_dir)
    except GantryError as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        raise OutputRefused(
            f"the job finished but its output could not be committed to {dataset}: "
            f"{exc.message}{hint}; the files are kept in {kept}"
        ) from exc
    note(f"committed {version} with lineage to job {job.job_id}")
    return version


__all__ = [
    "Note",
    "OutputRefused",
    "commit_output",
    "fetch_input_model",
    "job_metrics",
    "register_model",
]
