"""``gantry admin``: the key directory, identity tokens and service accounts."""

from __future__ import annotations

from typing import Annotated

import typer

from gantry.client.cli._common import DataDirOpt, command_settings, state_of

admin_app = typer.Typer(help="Keys, tokens and service accounts.", no_args_is_help=True)
token_app = typer.Typer(help="Identity tokens.", no_args_is_help=True)
account_app = typer.Typer(help="Service accounts of outside services.", no_args_is_help=True)
admin_app.add_typer(token_app, name="token")
admin_app.add_typer(account_app, name="service-account")


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
