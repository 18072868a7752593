"""``python -m gantry.training.session --name NAME --token-sha256 HEX [options]``: the worker
side of an interactive dev session.

The node agent runs this like any ``module`` job. It serves a Jupyter server (the REST API,
kernels and terminals; no browser, no UI extension) on ``0.0.0.0:$MASTER_PORT`` with its root
in a working directory under the job's directory, and ends by itself:

- **idle**: kernels and terminals quiet for ``--idle-timeout`` seconds are culled, and the
  session ends once no kernel is busy and nothing (API call, kernel message, terminal output)
  has happened for that long;
- **expired**: ``--lifetime`` seconds after it became ready, whatever it is doing;
- **signal**: SIGTERM (a preemption or a cancel);
- **stopped**: the server was asked to stop (``POST /api/shutdown``).

Files survive: at start the working directory is restored from the encrypted object store
(``sessions/<NAME>/files.tar.gz``), and at every end it is archived back, unless its files add
up to more than ``--max-files-bytes`` (then the previous archive is kept and the end line says
so). Every end writes ``metrics.json`` (``session_culled``, ``session_expired``,
``session_active_s``, ``session_files_bytes``, ``session_files_saved``) and exits 0, so a
preempted session is requeued and resumes with its files.

Requests must carry the session's token (``Authorization: token <t>`` or ``?token=<t>``); the
node only ever sees its SHA-256. ``--kind shell`` serves terminals only: no kernel, kernel spec
or notebook-session API at all.

Exit codes: 0 ended (any of the ways above); 1 the files could not be saved (the previous
archive is kept); 2 the session is misconfigured or could not start.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import io
import os
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from jupyter_server.auth.identity import IdentityProvider, User
from jupyter_server.serverapp import ServerApp
from jupyter_server.utils import JupyterServerAuthWarning
from pydantic import AliasChoices, Field
from tornado import ioloop, web
from traitlets import Unicode
from traitlets.config import Config

from gantry.core import (
    CommonSettings,
    ConfigError,
    Conflict,
    GantryError,
    InvalidInput,
    configure_logging,
    load_settings,
)
from gantry.storage import ObjectNotFound, ObjectStore, ObjectWriter, StorageSettings, open_store
from gantry.training.outputs import write_metrics

if TYPE_CHECKING:
    from gantry.training.task import DataContext

EXIT_SAVE_FAILED = 1
EXIT_CONFIG = 2

Kind = Literal["jupyter", "shell"]
Ending = Literal["idle", "expired", "signal", "stopped"]

#: Files a session keeps unless told otherwise: 1 GiB (source, notebooks and small results;
#: datasets and checkpoints belong in the platform's own stores).
DEFAULT_MAX_FILES_BYTES = 1 << 30
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
#: The services a shell session serves: no kernels, kernel specs or notebook sessions.
_SHELL_SERVICES = ("api", "auth", "config", "contents", "files", "security", "shutdown")


def files_key(name: str) -> str:
    """The object that holds session ``name``'s files."""
    return f"sessions/{name}/files.tar.gz"


class FilesTooLarge(Conflict):
    """The working directory holds more than a session may keep; nothing was saved."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"the session's files are {size:,} bytes, more than --max-files-bytes {limit:,}: "
            "not saved, the previous save is kept",
            hint="delete large files (datasets and checkpoints belong in the platform's stores) "
            "or start the session with a larger --max-files-bytes",
        )


class SessionSettings(CommonSettings):
    """What a session worker reads from the environment the node agent gives it."""

    storage: StorageSettings = Field(default_factory=StorageSettings)
    output_dir: Path | None = Field(
        default=None, description="Where metrics.json is written (GANTRY_OUTPUT_DIR)."
    )
    checkpoint_dir: Path | None = Field(
        default=None,
        description="The job's directory on the node (GANTRY_CHECKPOINT_DIR); the working "
        "directory is its session-files/. Unset (by hand): a temporary directory.",
    )
    port: int = Field(
        default=0,
        ge=0,
        le=65535,
        validation_alias=AliasChoices("MASTER_PORT"),
        description="The port the scheduler allocated for this attempt (MASTER_PORT); "
        "0 = any free port.",
    )


@dataclass(frozen=True)
class SessionOptions:
    """The session's command line."""

    name: str
    token_sha256: str
    kind: Kind = "jupyter"
    idle_timeout: float = 1800.0
    """Seconds of quiet before kernels and terminals are culled and the session ends."""
    lifetime: float = 12 * 3600.0
    """Seconds from ready after which the session ends whatever it is doing."""
    max_files_bytes: int = DEFAULT_MAX_FILES_BYTES

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise InvalidInput(
                f"session name {self.name!r} is not a name",
                hint="use letters, digits, '.', '_' and '-' (at most 128, starting with a "
                "letter or digit)",
            )
        if not _SHA256_HEX.fullmatch(self.token_sha256):
            raise InvalidInput(
                "--token-sha256 is not 64 hexadecimal digits",
                hint="pass hashlib.sha256(token.encode()).hexdigest(), never the token",
            )
        if self.idle_timeout <= 0 or self.lifetime <= 0 or self.max_files_bytes < 0:
            raise InvalidInput(
                "--idle-timeout and --lifetime must be positive, --max-files-bytes not negative"
            )


def parse_args(argv: Sequence[str]) -> SessionOptions:
    """The options in ``argv``; argparse exits 2 on a malformed command line."""
    parser = argparse.ArgumentParser(
        prog="python -m gantry.training.session", description="An interactive dev session."
    )
    parser.add_argument("--name", required=True, help="the session, whose files are kept")
    parser.add_argument("--token-sha256", required=True, help="hex SHA-256 of the token")
    parser.add_argument("--kind", choices=("jupyter", "shell"), default="jupyter")
    parser.add_argument("--idle-timeout", type=float, default=1800.0, metavar="SECONDS")
    parser.add_argument("--lifetime", type=float, default=12 * 3600.0, metavar="SECONDS")
    parser.add_argument("--max-files-bytes", type=int, default=DEFAULT_MAX_FILES_BYTES)
    ns = parser.parse_args(list(argv))
    return SessionOptions(
        name=ns.name,
        token_sha256=ns.token_sha256.lower(),
        kind=ns.kind,
        idle_timeout=ns.idle_timeout,
        lifetime=ns.lifetime,
        max_files_bytes=ns.max_files_bytes,
    )


class SessionTokenIdentityProvider(IdentityProvider):
    """Admits a request carrying the token whose SHA-256 is ``token_sha256``, in an
    ``Authorization: token <t>`` header or a ``?token=<t>`` parameter; nothing else (no
    password, no login cookie, no anonymous user)."""

    token_sha256 = Unicode("", config=True, help="Hex SHA-256 of the session's token.")
    token = Unicode("", config=True, help="Unused: the clear token never reaches the node.")

    def get_user(self, handler: web.RequestHandler) -> User | None:
        supplied = self.get_token(handler)
        if not supplied or len(self.token_sha256) != 64:
            return None
        digest = hashlib.sha256(supplied.encode()).hexdigest()
        if not hmac.compare_digest(digest, self.token_sha256.lower()):
            return None
        return User(username="session", name="session", display_name="Gantry session")

    def is_token_authenticated(self, handler: web.RequestHandler) -> bool:
        # every user admitted here came with the token: it exempts the request from the XSRF
        # check (scripts and proxies send no XSRF cookie) and from the origin check
        return handler.current_user is not None

    @property
    def login_available(self) -> bool:
        return False

    @property
    def logout_available(self) -> bool:
        return False


class _SessionServerApp(ServerApp):
    """The server, configured only by the session's command line."""

    def load_config_file(self, *args: Any, **kwargs: Any) -> None:
        # the node's (or the image's) Jupyter config files must not change how a session is
        # served, authentication above all
        return None


# -- files ------------------------------------------------------------------------------------


def files_bytes(workdir: Path) -> int:
    """The bytes of the regular files under ``workdir`` (symbolic links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(workdir):
        for name in files:
            path = Path(root, name)
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
    return total


def restore_files(store: ObjectStore, name: str, workdir: Path) -> bool:
    """Make ``workdir`` hold session ``name``'s saved files (empty when it has none); whether
    there were any. The archive is authoritative: what an attempt did not save is gone."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    try:
        reader = store.open(files_key(name))
    except ObjectNotFound:
        return False
    # a stream ("r|gz") only calls read(), which typeshed's file protocol does not capture
    with reader, tarfile.open(fileobj=reader, mode="r|gz") as archive:  # type: ignore[call-overload]
        # "data": no absolute paths, no links out of workdir, no devices or set-uid bits
        archive.extractall(workdir, filter="data")
    return True


class _WriterFile(io.RawIOBase):
    """An ObjectWriter as a binary file for tarfile."""

    def __init__(self, writer: ObjectWriter) -> None:
        self._writer = writer

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._writer.write(chunk)
        return len(chunk)


def save_files(store: ObjectStore, name: str, workdir: Path, *, max_bytes: int) -> int:
    """Archive ``workdir`` as session ``name``'s files; the bytes of its files.

    :class:`FilesTooLarge` (nothing written) above ``max_bytes``. The archive replaces the
    previous one only once it is whole: a failed upload leaves the previous one in place.
    """
    size = files_bytes(workdir)
    if size > max_bytes:
        raise FilesTooLarge(size, max_bytes)
    with (
        store.writer(files_key(name)) as writer,
        io.BufferedWriter(_WriterFile(writer), buffer_size=1 << 20) as sink,
        tarfile.open(fileobj=sink, mode="w|gz") as archive,
    ):
        for entry in sorted(workdir.iterdir()):
            archive.add(entry, arcname=entry.name)
    return size


# -- the server -------------------------------------------------------------------------------


def server_config(options: SessionOptions, workdir: Path, port: int) -> Config:
    """The Jupyter server's configuration for a session."""
    idle = max(1, round(options.idle_timeout))
    interval = max(1, min(idle // 4, 60))
    cfg = Config()
    # every interface: the platform reaches the session from another machine, and only
    # requests carrying its token are served
    cfg.ServerApp.ip = "0.0.0.0"  # noqa: S104
    cfg.ServerApp.port = port
    cfg.ServerApp.port_retries = 0  # only the port the scheduler allocated is reachable
    cfg.ServerApp.open_browser = False
    cfg.ServerApp.no_browser_open_file = True
    cfg.ServerApp.allow_root = True  # the job's image decides the user, often root in a container
    cfg.ServerApp.root_dir = str(workdir)
    cfg.ServerApp.allow_remote_access = True  # reached through the platform, by token
    cfg.ServerApp.allow_unauthenticated_access = False
    cfg.ServerApp.identity_provider_class = SessionTokenIdentityProvider
    cfg.SessionTokenIdentityProvider.token_sha256 = options.token_sha256
    cfg.ServerApp.jpserver_extensions = {"jupyter_server_terminals": True}
    cfg.ServerApp.terminals_enabled = True
    cfg.ServerApp.shutdown_no_activity_timeout = 0  # minute-grained; the session checks itself
    cfg.FileContentsManager.delete_to_trash = False  # a trash outside workdir is never saved
    cfg.MappingKernelManager.cull_idle_timeout = idle
    cfg.MappingKernelManager.cull_interval = interval
    cfg.MappingKernelManager.cull_connected = True  # a forgotten open tab must not hold a node
    cfg.MappingKernelManager.cull_busy = False  # a long computation is not idleness
    cfg.TerminalManager.cull_inactive_timeout = idle
    cfg.TerminalManager.cull_interval = interval
    return cfg


def last_activity(app: ServerApp) -> datetime | None:
    """When the server last did something (None: a kernel is busy, or starting, now).

    Like the server's own ``last_activity`` but without counting a kernel's shutdown as
    activity, so culling the last kernel does not restart the idle clock.
    """
    settings = app.web_app.settings
    times: list[datetime] = [settings["started"]]
    times += [settings[k] for k in ("api_last_activity", "terminal_last_activity") if k in settings]
    times += list(settings.get("last_activity_times", {}).values())
    manager = app.kernel_manager
    for kernel_id in manager.list_kernel_ids():
        kernel = manager.get_kernel(kernel_id)
        if getattr(kernel, "execution_state", None) in {"busy", "starting"}:
            return None
        kernel_active = getattr(kernel, "last_activity", None)
        if kernel_active is not None:
            times.append(kernel_active)
    terminals = settings.get("terminal_manager")
    for terminal in getattr(terminals, "terminals", {}).values():
        terminal_active = getattr(terminal, "last_activity", None)
        if terminal_active is not None:
            times.append(terminal_active)
    return max(times)


@dataclass
class _Session:
    """How the session is going: when it became ready and why it ended."""

    app: ServerApp
    options: SessionOptions
    ready_at: float = 0.0
    ended_at: float = 0.0
    ending: Ending = "stopped"
    ending_requested: bool = False

    def end(self, why: Ending, *, from_signal: bool = False) -> None:
        if self.ending_requested:
            return
        self.ending_requested = True
        self.ending = why
        self.app.stop(from_signal=from_signal)

    def check_idle(self) -> None:
        last = last_activity(self.app)
        if last is not None:
            quiet = (datetime.now(UTC) - last).total_seconds()
            if quiet >= self.options.idle_timeout:
                self.end("idle")

    def on_signal(self, signum: int, _frame: object) -> None:
        self.end("signal", from_signal=True)

    def ready(self) -> None:
        self.ready_at = time.monotonic()
        loop = ioloop.IOLoop.current()
        loop.call_later(self.options.lifetime, self.end, "expired")
        check_ms = 1000 * min(max(self.options.idle_timeout / 4, 0.5), 30)
        ioloop.PeriodicCallback(self.check_idle, check_ms).start()
        port = self.app.port
        print(f"session {self.options.name} ready on port {port} ({self.options.kind})", flush=True)


def run_session(options: SessionOptions, settings: SessionSettings) -> int:
    """Serve the session until it ends, then save its files; the process exit code."""
    store = open_store(settings.storage, data_dir=settings.data_dir)
    for key in [k for k in os.environ if k.startswith("GANTRY_STORAGE__")]:
        del os.environ[key]  # kernels and terminals inherit the environment: they need no store
    if settings.checkpoint_dir is not None:
        job_dir = settings.checkpoint_dir
        job_dir.mkdir(parents=True, exist_ok=True)
    else:
        job_dir = Path(tempfile.mkdtemp(prefix=f"gantry-session-{options.name}-"))
    workdir = (job_dir / "session-files").resolve()
    # connection files (they hold the kernels' keys) and kernel history stay with the job,
    # out of the saved files
    os.environ["JUPYTER_RUNTIME_DIR"] = str(job_dir / "session-runtime")
    os.environ["IPYTHONDIR"] = str(job_dir / "session-ipython")
    restored = restore_files(store, options.name, workdir)
    print(
        f"session {options.name}: "
        + ("files restored" if restored else "no saved files, starting empty"),
        flush=True,
    )

    os.chdir(workdir)  # where a kernel started without a notebook path runs, and terminals
    app = _SessionServerApp(config=server_config(options, workdir, settings.port))
    if options.kind == "shell":
        # typed as the thirteen default services, though any subset is how it is meant to be used
        app.default_services = _SHELL_SERVICES  # type: ignore[assignment]
    session = _Session(app, options)
    # the terminals' websocket has no decorator of its own, and says so; it is guarded all the
    # same, as every endpoint is when unauthenticated access is off (the tests check it)
    warnings.filterwarnings("ignore", category=JupyterServerAuthWarning)
    try:
        app.initialize(argv=[], find_extensions=False)
        signal.signal(signal.SIGTERM, session.on_signal)
        signal.signal(signal.SIGINT, session.on_signal)
        app.io_loop.add_callback(session.ready)
        app.start()
    except SystemExit as exc:  # the server exits when it cannot listen or must not start
        if not session.ready_at:  # nothing ran: the restored files are unchanged
            raise ConfigError(
                f"the Jupyter server could not start (exit {exc.code})",
                hint=f"see the server's log above (is port {settings.port} free?)",
            ) from None
    session.ended_at = time.monotonic()
    return _finish(session, store, workdir, settings)


def _finish(session: _Session, store: ObjectStore, workdir: Path, settings: SessionSettings) -> int:
    """Save the files and write the metrics after the server stopped; the exit code."""
    options = session.options
    active = session.ended_at - session.ready_at if session.ready_at else 0.0
    code, saved = 0, False
    try:
        size = save_files(store, options.name, workdir, max_bytes=options.max_files_bytes)
        saved = True
        note = f"files saved ({size:,} bytes)"
    except FilesTooLarge as exc:
        size, note = exc.size, str(exc)
    except (GantryError, OSError) as exc:
        size, code = files_bytes(workdir), EXIT_SAVE_FAILED
        note = f"files NOT saved, the previous save is kept: {exc}"
    why = {
        "idle": f"idle for {options.idle_timeout:g} s",
        "expired": f"lifetime of {options.lifetime:g} s reached",
        "signal": "stopped by a signal (preemption or cancel)",
        "stopped": "the server was stopped",
    }[session.ending]
    if settings.output_dir is not None:
        write_metrics(
            settings.output_dir,
            {
                "session_culled": float(session.ending == "idle"),
                "session_expired": float(session.ending == "expired"),
                "session_active_s": round(active, 3),
                "session_files_bytes": size,
                "session_files_saved": float(saved),
            },
        )
    print(f"session {options.name} ended after {active:.1f} s: {why}; {note}", flush=True)
    return code


# -- in a notebook ----------------------------------------------------------------------------


def data() -> DataContext:
    """The session job's data, for a notebook: the datasets its spec names, read through its
    grant in the view the grant allows (de-identified where the job is)::

        from gantry.training.session import data
        table = data().table("churn")
    """
    from gantry.training.task import DataContext, read_spec
    from gantry.training.trainer import WorkerEnv

    spec, _name = read_spec()
    return DataContext(WorkerEnv.from_environ(), spec)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring for the exit codes."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options = parse_args(args)
        settings = load_settings(SessionSettings)
        configure_logging("dev-session", level=settings.log_level, json=settings.log_json)
        return run_session(options, settings)
    except GantryError as exc:
        print(f"gantry: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG


__all__ = [
    "DEFAULT_MAX_FILES_BYTES",
    "FilesTooLarge",
    "SessionOptions",
    "SessionSettings",
    "SessionTokenIdentityProvider",
    "data",
    "files_bytes",
    "files_key",
    "main",
    "parse_args",
    "restore_files",
    "run_session",
    "save_files",
    "server_config",
]


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
