"""Jobs reading personal or sensitive data stay on trusted pools."""

from __future__ import annotations

import pytest

from gantry.core import InvalidInput
from gantry.sched.pools import DataSensitivity, Pool, eligible_pools

POOLS = {"onprem": Pool("onprem", trusted=True), "cloud": Pool("cloud", trusted=False)}


def test_sensitive_data_confines_a_job_to_trusted_pools() -> None:
    known = DataSensitivity()
    known.observe("clicks", "public")
    known.observe("customers", "pii")
    anywhere, why = eligible_pools(["clicks"], POOLS, known)
    assert anywhere == {"onprem", "cloud"} and why == ""
    trusted, why = eligible_pools(["clicks", "customers"], POOLS, known)
    assert trusted == {"onprem"}
    assert "customers" in why and "not in cloud" in why


def test_unknown_datasets_are_treated_as_sensitive() -> None:
    trusted, why = eligible_pools(["mystery"], POOLS, DataSensitivity())
    assert trusted == {"onprem"} and "mystery" in why


def test_bad_levels_are_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown sensitivity 'secret'"):
        DataSensitivity().observe("x", "secret")
