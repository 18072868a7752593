"""Fixtures of the whole-platform tests: one embedded platform (NATS, every service and the web
console, two node agents) shared by every test module that asks for it, and the ``churn``
dataset committed on it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import yaml

from gantry.client.admin import create_token
from gantry.client.demo_training import POLICY, churn_columns
from gantry.client.governance import GovernanceClient
from gantry.client.specs import ColumnSpec
from gantry.supervisor.platform import CONSOLE, DEFAULT_SERVICES, Platform, local_agents


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    data = tmp_path_factory.mktemp("platform") / "data"
    logs: list[str] = []
    running = Platform(
        data,
        nats_port=0,
        services=(*DEFAULT_SERVICES, CONSOLE),
        agents=local_agents(2, gpus=0),
        service_env={"GANTRY_WORKFLOWS__TICK_S": "0.2", "GANTRY_WORKFLOWS__POLL_S": "0.5"},
        log_sink=logs.append,
    )
    running.start()
    yield running
    running.stop()


def token_for(platform: Platform, who: str, roles: list[str]) -> str:
    """A one-hour token for ``who`` with ``roles`` (the platform's own key signs it)."""
    return create_token(platform.data_dir, who, roles, dt.timedelta(hours=1))


@pytest.fixture(scope="session")
def version(platform: Platform) -> str:
    """``churn`` uploaded and committed by a steward; ``churn-features`` created for the data
    step to commit into."""
    from gantry.training.examples.tabular import FEATURES_SCHEMA_YAML, churn_table

    steward = token_for(platform, "sam-steward", ["data-steward"])
    with GovernanceClient(platform.address("governance"), steward) as gov:
        gov.create_dataset("churn", columns=churn_columns(), description="churn (example)")
        up = gov.upload_table("churn", churn_table(3000))
        committed = gov.commit("churn", [up.upload_id], "snapshot")
        gov.set_view_policy("churn", POLICY)
        features = [
            ColumnSpec(c["name"], c["type"], c["class"], nullable=c.get("nullable", True))
            for c in yaml.safe_load(FEATURES_SCHEMA_YAML)["columns"]
        ]
        gov.create_dataset("churn-features", columns=features, description="cleaned churn")
        gov.set_view_policy("churn-features", POLICY)
    return committed.id
