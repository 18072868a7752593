"""gantry.testing: the harness Gantry's own tests use — real servers, started on port 0."""

from gantry.supervisor import NatsServer
from gantry.testing.postgres import admin_url, reachable, temporary_database

__all__ = ["NatsServer", "admin_url", "reachable", "temporary_database"]
