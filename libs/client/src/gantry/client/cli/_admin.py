"""``gantry admin``: the key directory, identity tokens, service accounts, TLS certificates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gantry.client.cli._admin_nats import admin_nats_config, admin_streams
from gantry.client.cli._admin_tokens import token_revoke, token_revoked
from gantry.client.cli._common import DataDirOpt, command_settings, state_of

admin_app = typer.Typer(
    help="Keys, tokens, service accounts, and the bus's users and streams.", no_args_is_help=True
)
token_app = typer.Typer(help="Identity tokens.", no_args_is_help=True)
account_app = typer.Typer(help="Service accounts of outside services.", no_args_is_help=True)
admin_app.add_typer(token_app, name="token")
admin_app.add_typer(account_app, name="service-account")
admin_app.command("nats-config")(admin_nats_config)
admin_app.command("streams")(admin_streams)
token_app.command("revoke")(token_revoke)
token_app.command("revoked")(token_revoked)


@admin_app.command("init")
def admin_init(ctx: typer.Context, data_dir: DataDirOpt = None) -> None:
    """Create the key directory (kept if it exists) and write a fresh admin token."""
    from gantry.client import admin

    settings = command_settings(ctx, data_dir)
    result = admin.init(settings.data_dir)
    out = state_of(ctx).out
    verb = "created" if result.created_keys else "kept existing"
    out.print(
        f"{verb} keys in {result.keys_dir} (token-signing key id {result.issuer_kid})",
        markup=False,
    )
    out.print(f"admin token written to {result.token_path} (mode 0600, valid 12h)", markup=False)
    out.print(
        f"NATS passwords (one per service user) in {result.nats_credentials_path} (mode 0600)",
        markup=False,
    )


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    user: Annotated[str, typer.Option("--user", help="Subject of the token.")],
    role: Annotated[
        list[str], typer.Option("--role", help="A role from the RBAC policy (repeatable).")
    ],
    ttl: Annotated[str, typer.Option("--ttl", help="Lifetime: 30m, 12h, 7d (max 30d).")] = "12h",
    data_dir: DataDirOpt = None,
) -> None:
    """Issue a token and print it."""
    from gantry.client import admin
    from gantry.security import parse_ttl

    settings = command_settings(ctx, data_dir)
    print(admin.create_token(settings.data_dir, user, list(role), parse_ttl(ttl)))


@account_app.command("create")
def service_account_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Service account name, e.g. feature-store.")],
    ttl: Annotated[str, typer.Option("--ttl", help="Token lifetime (max 30d).")] = "12h",
    data_dir: DataDirOpt = None,
) -> None:
    """Create a signing key and a 'service' token for an outside service."""
    from gantry.client import admin

    settings = command_settings(ctx, data_dir)
    token, key_path = admin.create_service_account(settings.data_dir, name, ttl=ttl)
    print(f"signing key: {key_path}")
    print(f"token: {token}")


@admin_app.command("certs")
def admin_certs(
    ctx: typer.Context,
    out: Annotated[
        Path,
        typer.Option("--out", help="Directory for ca.crt, ca.key, <name>.crt and <name>.key."),
    ],
    name: Annotated[
        list[str] | None,
        typer.Option(
            "--name",
            help="Who gets a certificate (repeatable); default: every service, training-agent, "
            "nats and client.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="Another DNS name or IP address for every certificate (repeatable), e.g. "
            "audit.gantry.svc; the name, localhost and 127.0.0.1 are always in.",
            show_default=False,
        ),
    ] = None,
    days: Annotated[int, typer.Option("--days", help="Validity of each certificate.")] = 365,
) -> None:
    """Write a development CA and a TLS certificate per name (GANTRY_TLS__*).

    A CA already in --out (ca.crt and ca.key) is reused, so certificates issued before stay
    valid; a certificate of the same name is replaced.
    """
    from gantry.client import admin

    names = list(name) if name else list(admin.CERTIFICATE_NAMES)
    result = admin.issue_certificates(out, names, hosts=list(host or ()), days=days)
    console = state_of(ctx).out
    verb = "created" if result.created_ca else "reused"
    console.print(f"{verb} the CA {result.ca_file} (its key ca.key: mode 0600)", markup=False)
    count = len(result.issued)
    table = Table(title=f"{count} certificate{'' if count == 1 else 's'} in {out}")
    for column in ("name", "certificate", "key (mode 0600)", "expires"):
        table.add_column(column, overflow="fold")
    for cert in result.issued:
        table.add_row(
            cert.name,
            cert.cert_file.name,
            cert.key_file.name,
            cert.not_after.strftime("%Y-%m-%d"),
        )
    console.print(table)
    first = result.issued[0]  # every certificate names the same hosts besides itself
    others = ", ".join([*first.dns_names[1:], *first.ip_addresses])
    console.print(f"each names itself and {others}", markup=False)
    console.print(
        "Give each process GANTRY_TLS__ENABLED=true, GANTRY_TLS__CA_FILE=<out>/ca.crt and its "
        "own GANTRY_TLS__CERT_FILE / GANTRY_TLS__KEY_FILE (servers: add "
        "GANTRY_TLS__CLIENT_AUTH=true for mutual TLS).",
        markup=False,
    )
