"""Shared fixtures of the serving tests."""

from __future__ import annotations

import pytest

from .fake_backend import FakeBackend


@pytest.fixture
def fake_backend() -> FakeBackend:
    """A fresh in-memory inference backend (see :mod:`fake_backend`)."""
    return FakeBackend()
