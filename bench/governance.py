"""Benchmark: encrypted storage format, governed loading, and transfers through the service.

    python bench/governance.py [--quick]

Figures (every speed beside its baseline from the same run):

- ``encrypt_mb_s`` / ``decrypt_mb_s``: the chunked AES-256-GCM object format (1 MiB chunks)
  over N MiB in memory (256 MiB; 64 MiB with --quick): ``ObjectStore.put`` and ``get`` of
  the whole object (each chunk sealed or opened in place in one object-sized buffer), against
  ``raw_aesgcm_mb_s`` / ``raw_aesgcm_decrypt_mb_s``: ONE AESGCM call over the same bytes with
  ``cryptography``; best of 5 each.
- ``loader_samples_per_s``: the governed reader (shards from the governance service over
  gRPC, encrypted at rest, de-identified view, through the encrypted node cache), steady
  state (epochs after the first); ``loader_cold_samples_per_s`` is its first epoch (every
  shard fetched from the service). ``plain_loader_samples_per_s``: the same columns and rows
  from local unencrypted Parquet through a plain PyTorch DataLoader. ``loader_ratio`` =
  governed / plain.
- ``upload_mb_s`` / ``download_mb_s``: rows through the service's gRPC API to the local
  backend and back (raw view), in MB of Arrow data.

Prints one JSON object as its LAST line and writes it to bench/results/governance.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit_result

MB = 1 << 20


def _best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def _chunked_backend() -> Any:
    """An in-memory backend that keeps a blob as the chunks it was written in.

    Like the raw call it is compared with, it ends up holding the whole ciphertext in memory,
    but without joining it into one buffer (a file or an S3 upload never does that either).
    """
    from gantry.storage import MemoryBackend

    class ChunkedMemoryBackend(MemoryBackend):
        def __init__(self) -> None:
            super().__init__()
            self.parts: dict[str, list[bytes]] = {}

        def put_stream(self, name: str, chunks: Any) -> int:
            if not name.startswith("_body/"):
                return int(super().put_stream(name, chunks))
            parts = list(chunks)
            self.parts[name] = parts
            super().put_stream(name, [b""])  # the name, for listing and deletes
            return sum(len(p) for p in parts)

        def get_stream(self, name: str, offset: int = 0) -> Any:
            if name not in self.parts:
                yield from super().get_stream(name, offset)
            elif offset:
                yield b"".join(self.parts[name])[offset:]
            else:
                yield from self.parts[name]

        def get_range(self, name: str, offset: int, length: int) -> bytes:
            if name not in self.parts:
                return bytes(super().get_range(name, offset, length))
            return b"".join(self.parts[name])[offset : offset + length]

        def size(self, name: str) -> int:
            if name not in self.parts:
                return int(super().size(name))
            return sum(len(p) for p in self.parts[name])

        def delete(self, name: str) -> bool:
            self.parts.pop(name, None)
            return bool(super().delete(name))

    return ChunkedMemoryBackend()


def bench_crypto(size_mb: int, repeat: int, tmp: Path) -> dict[str, float]:
    """The object format (through ObjectStore) vs one raw AES-GCM call, in memory.

    Encrypt: ``put`` of the whole object; decrypt: ``get`` of it. Both end holding the full
    output in memory, as the raw calls do.
    """
    from gantry.storage import KeyManager, LocalKeyFile, ObjectStore

    data = os.urandom(size_mb * MB)
    key = AESGCM.generate_key(bit_length=256)
    aead = AESGCM(key)
    nonce = os.urandom(12)
    sealed = aead.encrypt(nonce, data, None)
    raw_enc = _best(lambda: aead.encrypt(nonce, data, None), repeat)
    raw_dec = _best(lambda: aead.decrypt(nonce, sealed, None), repeat)
    store = ObjectStore(
        _chunked_backend(), KeyManager(LocalKeyFile(tmp / "kek.json")), chunk_size=1 * MB
    )

    def read_all() -> bytearray:
        return store.get("bench/object")

    fmt_enc = _best(lambda: store.put("bench/object", data), repeat)
    fmt_dec = _best(read_all, repeat)
    assert read_all() == data
    out = {
        "crypto_mb": float(size_mb),
        "raw_aesgcm_mb_s": size_mb / raw_enc,
        "raw_aesgcm_decrypt_mb_s": size_mb / raw_dec,
        "encrypt_mb_s": size_mb / fmt_enc,
        "decrypt_mb_s": size_mb / fmt_dec,
    }
    out["encrypt_ratio_vs_raw"] = out["encrypt_mb_s"] / out["raw_aesgcm_mb_s"]
    out["decrypt_ratio_vs_raw"] = out["decrypt_mb_s"] / out["raw_aesgcm_decrypt_mb_s"]
    return out


def training_table(rows: int, features: int = 16) -> pa.Table:
    """Numeric features, a label, and a PII column the view hashes (loaders skip it)."""
    rng = np.random.default_rng(7)
    cols: dict[str, Any] = {f"f{i}": rng.standard_normal(rows) for i in range(features)}
    cols["label"] = rng.integers(0, 2, rows)
    cols["email"] = [f"user{i % 50_000}@example.com" for i in range(rows)]
    return pa.table(cols)


class Service:
    """NATS and the governance service in this process (a thread runs the event loop)."""

    def __init__(self, data_dir: Path) -> None:
        from gantry.core import NatsSettings
        from gantry.governance.app import GovernanceService
        from gantry.governance.settings import GovernanceOptions, GovernanceSettings
        from gantry.security import TokenIssuer
        from gantry.security.keyring import Keyring
        from gantry.supervisor import NatsServer

        self.nats = NatsServer(data_dir / "nats").start()
        keyring = Keyring(data_dir / "keys")
        self.issuer = TokenIssuer(keyring.issuer(create=True))
        settings = GovernanceSettings(
            data_dir=data_dir,
            nats=NatsSettings(url=self.nats.url),
            governance=GovernanceOptions(grpc_port=0, metrics_port=0),
        )
        self.service = GovernanceService(settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.service.grpc_port == 0 or not (data_dir / "run" / "governance.json").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the governance service did not start")
            time.sleep(0.05)
        self.address = f"127.0.0.1:{self.service.grpc_port}"

    def _run(self) -> None:
        self.loop.run_until_complete(self.service.run())

    def token(self, user: str, role: str, kind: str = "user") -> str:
        return str(self.issuer.issue(user, [role], dt.timedelta(hours=1), kind=kind))  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.service.stop)
        self.thread.join(30)
        self.nats.stop()


def _epoch_rate(loader: Any, rows: int) -> float:
    started = time.perf_counter()
    seen = 0
    for batch in loader:
        features = batch[0] if isinstance(batch, tuple | list) else batch
        seen += len(next(iter(features.values()))) if isinstance(features, dict) else len(features)
    elapsed = time.perf_counter() - started
    assert seen == rows, f"loader yielded {seen} of {rows} rows"
    return rows / elapsed


def bench_service(rows: int, shards: int, epochs: int, tmp: Path) -> dict[str, float]:
    """Upload, download and loading through a real governance service."""
    from gantry.client.governance import GovernanceClient
    from gantry.client.specs import ColumnSpec
    from gantry.dataload import (
        CachedShardSource,
        GovernanceShardSource,
        GovernedDataset,
        loader,
        plain_parquet_loader,
    )
    from gantry.storage import NodeCache

    table = training_table(rows)
    features = [c for c in table.column_names if c.startswith("f")]
    arrow_mb = table.nbytes / MB
    shard_bytes = max(64 << 10, table.nbytes // shards)
    out: dict[str, float] = {"loader_rows": float(rows), "transfer_mb": arrow_mb}

    # the plain baseline: the same rows as local Parquet files, one per shard
    plain_dir = tmp / "plain"
    plain_dir.mkdir()
    step = -(-rows // shards)
    paths = []
    for i, start in enumerate(range(0, rows, step)):
        path = plain_dir / f"part-{i:03d}.parquet"
        pq.write_table(table.slice(start, step), path)
        paths.append(path)
    plain = plain_parquet_loader(paths, 256, features, "label", shuffle=True)
    plain_rates = [_epoch_rate(plain, rows) for _ in range(epochs)]
    out["plain_loader_samples_per_s"] = max(plain_rates)

    service = Service(tmp / "data")
    try:
        columns = [ColumnSpec(c, "float64", "public") for c in features]
        columns += [ColumnSpec("label", "int64", "public"), ColumnSpec("email", "string", "pii")]
        with GovernanceClient(service.address, service.token("sam", "data-steward")) as steward:
            steward.create_dataset("bench", columns=columns)
            started = time.perf_counter()
            up = steward.upload_table("bench", table, shard_bytes=shard_bytes)
            version = steward.commit("bench", [up.upload_id], "bench data")
            out["upload_mb_s"] = arrow_mb / (time.perf_counter() - started)
            out["shards"] = float(up.shards)
            started = time.perf_counter()
            back = steward.read("bench", version.id, view="raw")
            out["download_mb_s"] = arrow_mb / (time.perf_counter() - started)
            assert back.num_rows == rows
            grant = steward.issue_grant(
                "bench-job", [("bench", version.id)], view="deidentified", ttl_s=3600
            )
        source = CachedShardSource(
            GovernanceShardSource(
                service.address,
                service.token("svc-agent", "service", kind="service"),
                "bench",
                version.id,
                grant.token,
            ),
            NodeCache(tmp / "cache", max_bytes=4 * table.nbytes),
            namespace="bench",
        )
        dataset = GovernedDataset(source, 256, columns=features, label="label", shuffle=True)
        rates = []
        for epoch in range(epochs + 1):
            dataset.set_epoch(epoch)
            rates.append(_epoch_rate(loader(dataset), rows))
        out["loader_cold_samples_per_s"] = rates[0]
        out["loader_samples_per_s"] = max(rates[1:])
    finally:
        service.close()
    out["loader_ratio"] = out["loader_samples_per_s"] / out["plain_loader_samples_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes; under a minute")
    args = parser.parse_args(argv)
    from gantry.core import configure_logging

    configure_logging("bench", level="WARNING", json=False)
    crypto_mb, repeat = (64, 5) if args.quick else (256, 5)
    rows, shards, epochs = (300_000, 8, 2) if args.quick else (2_000_000, 16, 3)
    with tempfile.TemporaryDirectory(prefix="gantry-bench-gov-") as tmp:
        figures: dict[str, Any] = {"benchmark": "governance", "quick": args.quick}
        figures.update(bench_crypto(crypto_mb, repeat, Path(tmp)))
        print(
            f"format: encrypt {figures['encrypt_mb_s']:.0f} MB/s, decrypt "
            f"{figures['decrypt_mb_s']:.0f} MB/s; raw AES-GCM {figures['raw_aesgcm_mb_s']:.0f}"
            f" / {figures['raw_aesgcm_decrypt_mb_s']:.0f} MB/s",
            flush=True,
        )
        figures.update(bench_service(rows, shards, epochs, Path(tmp)))
    emit_result(
        "governance", {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
