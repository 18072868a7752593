"""The governance catalog database (adapter): SQLAlchemy 2 Core on SQLite or PostgreSQL.

Content (shards, files, models, per-dataset secrets) lives encrypted in the object store; this
database holds what points at it: datasets, immutable versions and their manifests, uploads in
progress, view policies, grants, lineage edges and the model registry, the subject index (keyed
digests of pii values, never the values) and erasures, plus the outbox that carries each
change's event out in the same transaction.
"""

from __future__ import annotations

import sqlalchemy as sa

from gantry.core.database import add_column, connect_database, migrate_schema
from gantry.events import inbox_table, outbox_table

metadata = sa.MetaData()
_BigInt = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

datasets = sa.Table(
    "gov_datasets",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("format", sa.String(16), nullable=False),
    sa.Column("schema_json", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, default=""),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("head", sa.String(64), nullable=False, default=""),
    sa.Column("versions", sa.Integer, nullable=False, default=0),
    sa.Column("policy_version", sa.Integer, nullable=False, default=0),
)

versions = sa.Table(
    "gov_versions",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("dataset", sa.String(64), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("parents_json", sa.Text, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("author", sa.String(256), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("rollback_of", sa.String(64), nullable=False, default=""),
    sa.Column("manifest", sa.LargeBinary, nullable=False),
    # schema 4: the gantry.data.version.committed event written with the version ("" before)
    sa.Column("event_id", sa.String(64), nullable=False, default="", server_default=""),
    sa.UniqueConstraint("dataset", "seq", name="uq_gov_versions_seq"),
)

version_shards = sa.Table(
    "gov_version_shards",
    metadata,
    sa.Column("version_id", sa.String(64), primary_key=True),
    sa.Column("shard_id", sa.String(64), primary_key=True),
    sa.Column("dataset", sa.String(64), nullable=False),
    sa.Index("ix_gov_version_shards_shard", "dataset", "shard_id"),
)

uploads = sa.Table(
    "gov_uploads",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("dataset", sa.String(64), nullable=False),
    sa.Column("principal", sa.String(256), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # open | complete | committed | aborted
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("active_ms", sa.BigInteger, nullable=False),  # last shard written or finished
    sa.Column("rows", sa.BigInteger, nullable=False, default=0),
    sa.Column("bytes", sa.BigInteger, nullable=False, default=0),
)

upload_shards = sa.Table(
    "gov_upload_shards",
    metadata,
    sa.Column("upload_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("shard_id", sa.String(64), nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("object_name", sa.String(1024), nullable=False),
    sa.Column("path", sa.String(1024), nullable=False, default=""),
)

policies = sa.Table(
    "gov_policies",
    metadata,
    sa.Column("dataset", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("rules_json", sa.Text, nullable=False),
    sa.Column("author", sa.String(256), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
)

grants = sa.Table(
    "gov_grants",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("view", sa.String(16), nullable=False),
    sa.Column("versions_json", sa.Text, nullable=False),
    sa.Column("issued_by", sa.String(256), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("expires_ms", sa.BigInteger, nullable=False),
    sa.Column("revoked", sa.Boolean, nullable=False, default=False),
)

scheduled_jobs = sa.Table(
    "gov_scheduled_jobs",
    metadata,
    sa.Column("job_id", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(256), nullable=False),
    sa.Column("owner_roles_json", sa.Text, nullable=False),
    sa.Column("datasets_json", sa.Text, nullable=False),
    sa.Column("nodes_json", sa.Text, nullable=False),
    sa.Column("scheduled_ms", sa.BigInteger, nullable=False),
    # schema 3: the model version the job evaluates (spec.model, "name:version") and the dataset
    # it commits a version of (spec.output), which its agent may then download and commit
    sa.Column("input_model", sa.String(160), nullable=False, default="", server_default=""),
    sa.Column("output_dataset", sa.String(64), nullable=False, default="", server_default=""),
)

lineage = sa.Table(
    "gov_lineage",
    metadata,
    sa.Column("from_kind", sa.String(32), primary_key=True),
    sa.Column("from_id", sa.String(256), primary_key=True),
    sa.Column("to_kind", sa.String(32), primary_key=True),
    sa.Column("to_id", sa.String(256), primary_key=True),
    sa.Column("time_ms", sa.BigInteger, nullable=False),
    # schema 4: the event whose handling made the edge (data.accessed, model.registered,
    # data.version.committed); "" for edges made before
    sa.Column("event_id", sa.String(64), nullable=False, default="", server_default=""),
    sa.Column("event_type", sa.String(64), nullable=False, default="", server_default=""),
    sa.Index("ix_gov_lineage_to", "to_kind", "to_id"),
)

models = sa.Table(
    "gov_models",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("digest", sa.String(64), nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("object_name", sa.String(1024), nullable=False),
    sa.Column("framework", sa.String(64), nullable=False),
    sa.Column("job_id", sa.String(128), nullable=False),
    sa.Column("metrics_json", sa.Text, nullable=False),
    sa.Column("signature_json", sa.Text, nullable=False),
    sa.Column("trained_on_json", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("registered_by", sa.String(256), nullable=False),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    # schema 2; the server default fills the rows registered before it
    sa.Column("code_version", sa.String(256), nullable=False, default="", server_default=""),
)

# schema 4: data subjects. For each table shard, the keyed digest (16 bytes of HMAC-SHA256 under
# the dataset's hash key) of every distinct pii value, the pii columns it is in and the rows
# holding it; shards listed in gov_indexed_shards are fully indexed.
subject_index = sa.Table(
    "gov_subject_index",
    metadata,
    sa.Column("dataset", sa.String(64), primary_key=True),
    sa.Column("shard_id", sa.String(64), primary_key=True),
    sa.Column("digest", sa.LargeBinary(16), primary_key=True),
    sa.Column("columns", sa.Text, nullable=False),  # comma-separated pii column names
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Index("ix_gov_subject_index_digest", "dataset", "digest"),
)

indexed_shards = sa.Table(
    "gov_indexed_shards",
    metadata,
    sa.Column("dataset", sa.String(64), primary_key=True),
    sa.Column("shard_id", sa.String(64), primary_key=True),
    sa.Column("indexed_ms", sa.BigInteger, nullable=False),
)

erasures = sa.Table(
    "gov_erasures",
    metadata,
    sa.Column("erasure_id", sa.String(64), primary_key=True),
    sa.Column("subject_ref", sa.String(64), nullable=False),
    sa.Column("requested_by", sa.String(256), nullable=False),
    sa.Column("requested_ms", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("result_json", sa.Text, nullable=False),
    sa.Index("ix_gov_erasures_subject", "subject_ref"),
    sa.Index("ix_gov_erasures_requested", "requested_ms"),
)

erasure_digests = sa.Table(
    "gov_erasure_digests",
    metadata,
    sa.Column("dataset", sa.String(64), primary_key=True),
    sa.Column("digest", sa.LargeBinary(16), primary_key=True),
    sa.Column("erasure_id", sa.String(64), primary_key=True),
)

schema_version = sa.Table(
    "gov_schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
)

outbox = outbox_table(metadata, "gov_outbox")
inbox = inbox_table(metadata, "gov_inbox")

SCHEMA_VERSION = 4


def _migrate_v1(conn: sa.Connection) -> None:
    metadata.create_all(conn)


def _migrate_v2(conn: sa.Connection) -> None:
    """Model versions record the code version that trained them."""
    add_column(conn, models.c.code_version)


def _migrate_v3(conn: sa.Connection) -> None:
    """Scheduled jobs remember their input model and output dataset."""
    add_column(conn, scheduled_jobs.c.input_model)
    add_column(conn, scheduled_jobs.c.output_dataset)


def _migrate_v4(conn: sa.Connection) -> None:
    """Versions and lineage edges name their event; the subject index and erasures."""
    add_column(conn, versions.c.event_id)
    add_column(conn, lineage.c.event_id)
    add_column(conn, lineage.c.event_type)
    metadata.create_all(
        conn, tables=[subject_index, indexed_shards, erasures, erasure_digests], checkfirst=True
    )


MIGRATIONS = {1: _migrate_v1, 2: _migrate_v2, 3: _migrate_v3, 4: _migrate_v4}


def connect(url: str) -> sa.Engine:
    """An engine for the governance database at ``url``."""
    return connect_database(url, example="governance.db")


def migrate(engine: sa.Engine) -> int:
    """Bring the schema to :data:`SCHEMA_VERSION`; return the version found before."""
    return migrate_schema(engine, schema_version, MIGRATIONS)


__all__ = [
    "connect",
    "datasets",
    "erasure_digests",
    "erasures",
    "grants",
    "inbox",
    "indexed_shards",
    "lineage",
    "metadata",
    "migrate",
    "models",
    "outbox",
    "policies",
    "scheduled_jobs",
    "subject_index",
    "upload_shards",
    "uploads",
    "version_shards",
    "versions",
]
