"""The privacy budget's error, apart from :mod:`gantry.training.privacy` so that catching it
does not import Opacus (a second of every worker's start-up) in jobs that train without DP."""

from __future__ import annotations

from gantry.core import Conflict


class BudgetExceeded(Conflict):
    """Another optimizer step would spend more privacy than the job's epsilon allows.

    Permanent: the job stops with the model as of its last step, which is within budget.
    """

    def __init__(
        self, *, budget: float, delta: float, spent: float, next_epsilon: float, steps: int
    ) -> None:
        self.budget = budget
        self.delta = delta
        self.spent = spent
        self.next_epsilon = next_epsilon
        self.steps = steps
        super().__init__(
            f"privacy budget reached after {steps} steps: epsilon spent {spent:.4g}, one more "
            f"step would make it {next_epsilon:.4g} > spec.training.privacy.epsilon "
            f"{budget:g} (delta {delta:g})",
            hint="the model as of the last step is within budget; to train longer, plan the "
            "steps up front (epochs or steps) so the noise is sized for them, or raise "
            "spec.training.privacy.epsilon",
        )


__all__ = ["BudgetExceeded"]
