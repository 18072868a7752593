"""``gantry audit verify`` and ``gantry audit proof``: check the signed log locally.

``verify`` has the server recompute the log, checks the latest signed tree head against the
audit service's key, and checks with a consistency proof that it extends the head this data
directory saw last time (``<data-dir>/cli/last_head.json``). ``proof`` checks that one event is
in the signed log. Both are registered on the ``audit`` group by :mod:`gantry.client.cli._audit`.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from gantry.client.cli._common import (
    EXIT_FAILED,
    DataDirOpt,
    TokenOpt,
    audit_client,
    audit_trust,
    command_settings,
    iso_ms,
    state_of,
)
from gantry.client.errors import RemoteNotFound
from gantry.core import ConfigError, IntegrityError

if TYPE_CHECKING:
    from gantry.client.audit import AuditClient
    from gantry.security import TrustStore
    from gantry.security.treehead import TreeHead


def audit_verify(ctx: typer.Context, data_dir: DataDirOpt = None, token: TokenOpt = None) -> None:
    """Have the server recompute the log, then check the latest signed head locally.

    The head is checked against the trusted keys and, with a consistency proof, against the
    head this command saw last time (kept in <data-dir>/cli/last_head.json).
    """
    settings = command_settings(ctx, data_dir, token)
    out = state_of(ctx).out
    with audit_client(settings) as client:
        report = client.verify()
        if not report.ok:
            out.print(
                f"[red]FAILED[/]: {len(report.problems)} problem(s) in {report.events_checked:,} "
                f"events; first bad index {report.first_bad_index}"
            )
            for p in report.problems:
                out.print(f"  index {p.index}: {p.kind}: {p.detail}", markup=False)
            raise typer.Exit(EXIT_FAILED)
        out.print(
            f"[green]OK[/]: the server recomputed {report.events_checked:,} events and "
            f"{report.checkpoints_checked:,} signed checkpoints"
        )
        trust = audit_trust(settings)
        try:
            latest = client.checkpoint()
        except RemoteNotFound:
            out.print("no signed checkpoint yet; nothing more to check")
            return
        store = settings.data_dir / "cli" / "last_head.json"
        try:
            latest.check_signature(trust)
        except IntegrityError as exc:
            out.print(f"[red]FAILED[/]: {escape(exc.message)}")
            raise typer.Exit(EXIT_FAILED) from None
        seen = _load_head(store)
        try:
            message = _check_history(client, trust, seen, latest)
        except IntegrityError as exc:
            out.print(f"[red]FAILED[/]: history rewritten: {escape(exc.message)}")
            raise typer.Exit(EXIT_FAILED) from None
    out.print(
        f"[green]OK[/]: checkpoint of size {latest.tree_size:,} signed by {escape(latest.key_id)} "
        f"at {iso_ms(latest.timestamp_ms)}; {message}"
    )
    _save_head(store, latest)


def _check_history(
    client: AuditClient, trust: TrustStore, seen: TreeHead | None, latest: TreeHead
) -> str:
    """Check that ``latest`` extends ``seen``; raise IntegrityError if it does not."""
    if seen is None:
        return "first verification from this data dir (head remembered)"
    if seen.tree_size > latest.tree_size:
        raise IntegrityError(
            f"the log shrank from {seen.tree_size} to {latest.tree_size} entries since last seen"
        )
    if seen.tree_size == latest.tree_size:
        if seen.root_hash != latest.root_hash:
            raise IntegrityError(f"the root of the log of size {seen.tree_size} has changed")
        return f"unchanged since last seen (size {seen.tree_size:,})"
    try:
        first, _ = client.prove_consistency(trust, seen.tree_size, latest.tree_size)
    except RemoteNotFound:
        raise IntegrityError(
            f"the checkpoint of size {seen.tree_size} seen before is gone from the server"
        ) from None
    if first.root_hash != seen.root_hash:
        raise IntegrityError(f"the root of the log of size {seen.tree_size} has changed")
    return f"consistent with the head of size {seen.tree_size:,} seen before"


def _load_head(path: Path) -> TreeHead | None:
    from gantry.security.treehead import TreeHead

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return TreeHead(
            int(raw["tree_size"]),
            bytes.fromhex(raw["root_hash"]),
            int(raw["timestamp_ms"]),
            str(raw["key_id"]),
            base64.b64decode(raw["signature"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot read the remembered tree head {path}: {exc}",
            hint="delete the file to start remembering afresh",
        ) from None


def _save_head(path: Path, head: TreeHead) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "tree_size": head.tree_size,
        "root_hash": head.root_hash.hex(),
        "timestamp_ms": head.timestamp_ms,
        "key_id": head.key_id,
        "signature": base64.b64encode(head.signature).decode("ascii"),
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def audit_proof(
    ctx: typer.Context,
    event_id: Annotated[str, typer.Argument(help="The event's id.")],
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Prove that an event is in the signed log, checking the proof locally."""
    settings = command_settings(ctx, data_dir, token)
    out = state_of(ctx).out
    trust = audit_trust(settings)
    with audit_client(settings) as client:
        try:
            index, raw, head = client.prove_inclusion(trust, event_id=event_id)
        except IntegrityError as exc:
            out.print(f"[red]FAILED[/]: {escape(exc.message)}")
            raise typer.Exit(EXIT_FAILED) from None
    event = json.loads(raw)
    if event.get("id") != event_id:
        found = escape(repr(event.get("id")))
        out.print(f"[red]FAILED[/]: the proven entry {index} is event {found}")
        raise typer.Exit(EXIT_FAILED)
    out.print(
        f"[green]OK[/]: event {escape(event_id)} ({escape(str(event.get('type')))}) is entry "
        f"{index:,} of the log of size {head.tree_size:,}, root {head.root_hash.hex()[:16]}…, "
        f"signed by {escape(head.key_id)} at {iso_ms(head.timestamp_ms)}"
    )
