"""The console process: the web application under uvicorn, a run file, until signalled."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import uvicorn
from fastapi import FastAPI

from gantry.console.apis import Apis
from gantry.console.settings import ConsoleSettings
from gantry.console.viewer import Gatekeeper
from gantry.console.web import create_app
from gantry.core import Unavailable
from gantry.core.entrypoint import run_until_signalled
from gantry.core.logging import get_logger
from gantry.core.runfile import run_file, write_run_file
from gantry.security import Authorizer, default_policy
from gantry.security.keyring import Keyring
from gantry.security.policy import Policy
from gantry.security.tokens import TokenVerifier

SERVICE_NAME = "console"
_log = get_logger(__name__)


def build_app(settings: ConsoleSettings) -> FastAPI:
    """The ASGI application for ``settings`` (tests serve it themselves)."""
    o = settings.console
    policy = Policy.from_file(o.policy_file) if o.policy_file else default_policy()
    verifier = TokenVerifier(Keyring(settings.keys_dir).token_trust(), known_roles=policy.roles)
    gatekeeper = Gatekeeper(verifier, Authorizer(policy))
    return create_app(gatekeeper, Apis(settings), secure_cookie=o.public_url.startswith("https://"))


class ConsoleService:
    """Serves the console until :meth:`stop`."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self._stopping = asyncio.Event()
        self.port = 0

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()

    async def run(self) -> None:
        """Serve until stopped."""
        o = self.settings.console
        sock = socket.socket(
            socket.AF_INET6 if ":" in o.http_host else socket.AF_INET,
            socket.SOCK_STREAM,
            socket.IPPROTO_TCP,
        )
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((o.http_host, o.http_port))
        except OSError as exc:
            sock.close()
            raise Unavailable(
                f"the console cannot listen on {o.http_host}:{o.http_port}: {exc.strerror}",
                hint="choose another port (GANTRY_CONSOLE__HTTP_PORT, gantry up --console-port)",
            ) from None
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(self.settings),
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=5,
            )
        )
        task = asyncio.create_task(server.serve(sockets=[sock]), name="console")
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
        url = o.public_url or f"http://{o.http_host}:{self.port}"
        try:
            write_run_file(self.settings.data_dir, SERVICE_NAME, extra={"http": url})
        except OSError as exc:  # a read-only data dir (a container): the console still serves
            _log.warning("cannot write the run file", error=str(exc), url=url)
        _log.info("console ready", url=url)
        await self._stopping.wait()
        server.should_exit = True
        await task
        with contextlib.suppress(OSError):
            run_file(self.settings.data_dir, SERVICE_NAME).unlink(missing_ok=True)
        _log.info("console stopped")


async def serve(settings: ConsoleSettings) -> None:
    """Run the console until SIGTERM or SIGINT."""
    await run_until_signalled(ConsoleService(settings))


__all__ = ["SERVICE_NAME", "ConsoleService", "build_app", "serve"]
