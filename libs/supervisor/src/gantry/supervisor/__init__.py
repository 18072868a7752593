"""gantry.supervisor: the embedded platform behind ``gantry up`` (nats-server and services)."""

from gantry.supervisor.nats_server import NatsServer, find_nats_server, port_is_free
from gantry.supervisor.platform import Platform

__all__ = ["NatsServer", "Platform", "find_nats_server", "port_is_free"]
