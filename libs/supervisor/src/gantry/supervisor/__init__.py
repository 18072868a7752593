"""gantry.supervisor: the embedded platform behind ``gantry up`` (nats-server and services)."""

from gantry.supervisor.nats_server import NatsServer, find_nats_server, port_is_free

__all__ = ["NatsServer", "find_nats_server", "port_is_free"]
