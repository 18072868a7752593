"""``gantry admin token revoke | revoked``: refuse a token everywhere before it expires."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from gantry.client.cli._common import (
    DataDirOpt,
    TokenOpt,
    audit_client,
    command_settings,
    fmt_ms,
    state_of,
)
from gantry.core import InvalidInput


def token_revoke(
    ctx: typer.Context,
    target: Annotated[
        str | None,
        typer.Argument(metavar="[TOKEN]", help="The token to revoke ('-' reads it from stdin)."),
    ] = None,
    jti: Annotated[
        str | None, typer.Option("--jti", help="Revoke by token id instead (the 'jti' claim).")
    ] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (recorded in the audit log).")] = "",
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """Revoke a token: every service refuses it within a second (platform admins)."""
    if target == "-":
        target = typer.get_text_stream("stdin").read().strip()
    if not target and not jti:
        raise InvalidInput("name the token to revoke", hint="pass TOKEN, '-' or --jti ID")
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        revoked = client.revoke_token(token=target or "", jti=jti or "", reason=reason)
    who = f" of {revoked.subject}" if revoked.subject else ""
    state_of(ctx).out.print(
        f"token {revoked.jti}{who} revoked; refused everywhere until it expires "
        f"({fmt_ms(revoked.expires_ms)})",
        markup=False,
    )


def token_revoked(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    data_dir: DataDirOpt = None,
    token: TokenOpt = None,
) -> None:
    """The revoked tokens that have not expired yet."""
    settings = command_settings(ctx, data_dir, token)
    with audit_client(settings) as client:
        revoked = client.revoked_tokens()
    if as_json:
        for r in revoked:
            print(
                json.dumps(
                    {
                        "jti": r.jti,
                        "subject": r.subject,
                        "expires_ms": r.expires_ms,
                        "reason": r.reason,
                        "revoked_by": r.revoked_by,
                        "revoked_ms": r.revoked_ms,
                    }
                )
            )
        return
    table = Table("token id", "subject", "revoked", "by", "expires", "reason")
    for r in revoked:
        table.add_row(
            r.jti, r.subject, fmt_ms(r.revoked_ms), r.revoked_by, fmt_ms(r.expires_ms), r.reason
        )
    state_of(ctx).out.print(table)


__all__ = ["token_revoke", "token_revoked"]
