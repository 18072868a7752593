"""Models the demo's serving chapter makes (imported only when it runs: they need torch).

:class:`RegressedModel` stands for a bad release: it passes the serving service's warm-up,
which feeds small synthetic values, and fails on real customers' features (spend in the tens)
— the kind of fault only production traffic shows, which is what a canary is for.
"""

from __future__ import annotations

import torch


class RegressedModel(torch.nn.Module):
    """Two "logits" per row, or a failure when any feature exceeds 10 in magnitude."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fails on real features (see the module doc)."""
        if bool((x.abs() > 10.0).any()):
            raise RuntimeError("v3 regression: feature scaling overflow")
        return x[:, :2]


__all__ = ["RegressedModel"]
