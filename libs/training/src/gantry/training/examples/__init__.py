"""Example training jobs that run as they are: a task module and its job YAML each.

=========== ==================================================================================
name        what it trains
=========== ==================================================================================
tabular     a churn classifier on the governed table ``churn``, read de-identified
cnn         a small CNN on synthetic 28x28 images, with declared image augmentation, 2 workers
transformer a character-level transformer language model on text shipped with the package
sequences   a sequence regressor, 2 workers, one rank's data loader slowed (for the profiler)
=========== ==================================================================================

``python -m gantry.training.examples`` lists them; ``python -m gantry.training.examples NAME``
prints the job's YAML, ready for ``gantry jobs submit``. Each task is
``gantry.training.examples.<name>:task``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from gantry.core import InvalidInput


@dataclass(frozen=True)
class Example:
    """One example job: its name, what it shows, and where its task lives."""

    name: str
    summary: str

    @property
    def task(self) -> str:
        """The ``entrypoint.task`` reference of the example's job."""
        return f"{__name__}.{self.name}:task"

    def job_yaml(self) -> str:
        """The example's TrainingJob YAML, as shipped with the package."""
        return resources.files(__name__).joinpath(f"{self.name}.yaml").read_text()


EXAMPLES: tuple[Example, ...] = (
    Example(
        "tabular",
        "churn classifier on the governed table 'churn', read de-identified (needs the data)",
    ),
    Example("cnn", "small CNN on synthetic 28x28 images with image augmentation, 2 workers"),
    Example("transformer", "character-level transformer language model on shipped text"),
    Example("sequences", "sequence regressor, 2 workers, one slowed on purpose (profiler)"),
)


def example(name: str) -> Example:
    """The example called ``name``, or :class:`InvalidInput` naming the ones there are."""
    for item in EXAMPLES:
        if item.name == name:
            return item
    raise InvalidInput(
        f"there is no example {name!r}",
        hint=f"use one of {', '.join(e.name for e in EXAMPLES)}",
    )


__all__ = ["EXAMPLES", "Example", "example"]
