"""gantry.testing: the harness Gantry's own tests use — real servers, started on port 0."""

from gantry.supervisor import NatsServer
from gantry.testing.postgres import admin_url, reachable, temporary_database
from gantry.testing.s3 import S3Endpoint, docker_unreachable_reason, minio_server, moto_s3_server

__all__ = [
    "NatsServer",
    "S3Endpoint",
    "admin_url",
    "docker_unreachable_reason",
    "minio_server",
    "moto_s3_server",
    "reachable",
    "temporary_database",
]
