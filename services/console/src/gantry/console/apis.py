"""The services' public APIs, called with the viewer's own token.

Every page opens the clients it needs through :class:`Apis`; the address of each service is
its setting, else the run file of the platform the console runs beside (looked up at each call,
so a restarted service on a new port is found again). Nothing here caches what a service said.
"""

from __future__ import annotations

from gantry.client.audit import AuditClient
from gantry.client.governance import GovernanceClient
from gantry.client.profiler import ProfilerClient
from gantry.client.scheduler import SchedulerClient
from gantry.client.serving import ServingClient
from gantry.client.workflows import WorkflowsClient
from gantry.console.settings import ConsoleSettings
from gantry.console.viewer import Viewer
from gantry.core import TlsSettings
from gantry.core.runfile import service_address


class Apis:
    """Clients of the six services for one viewer at a time."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.timeout_s = settings.console.call_timeout_s

    def address(self, service: str) -> str:
        """``host:port`` of ``service`` (its setting, else the platform's run file)."""
        configured = str(getattr(self.settings.console, f"{service}_addr"))
        return service_address(
            self.settings.data_dir,
            service,
            configured=configured,
            setting=f"GANTRY_CONSOLE__{service.upper()}_ADDR",
        )

    def scheduler(self, viewer: Viewer) -> SchedulerClient:
        """The scheduler, as ``viewer``."""
        return SchedulerClient(
            self.address("scheduler"), viewer.token, timeout_s=self.timeout_s, tls=self._tls
        )

    def governance(self, viewer: Viewer) -> GovernanceClient:
        """Governance (datasets, lineage, the model registry), as ``viewer``."""
        return GovernanceClient(
            self.address("governance"),
            viewer.token,
            timeout_s=self.timeout_s,
            stream_timeout_s=self.timeout_s * 6,
            tls=self._tls,
        )

    def audit(self, viewer: Viewer) -> AuditClient:
        """The audit log, as ``viewer``."""
        return AuditClient(
            self.address("audit"), viewer.token, timeout_s=self.timeout_s, tls=self._tls
        )

    def serving(self, viewer: Viewer) -> ServingClient:
        """Serving (deployments, canaries), as ``viewer``."""
        return ServingClient(
            self.address("serving"), viewer.token, timeout_s=self.timeout_s, tls=self._tls
        )

    def profiler(self, viewer: Viewer) -> ProfilerClient:
        """The profiler (node health, per-rank phases), as ``viewer``."""
        return ProfilerClient(
            self.address("profiler"), viewer.token, timeout_s=self.timeout_s, tls=self._tls
        )

    def workflows(self, viewer: Viewer) -> WorkflowsClient:
        """Workflows (pipelines, experiments, dev sessions), as ``viewer``."""
        return WorkflowsClient(
            self.address("workflows"), viewer.token, timeout_s=self.timeout_s, tls=self._tls
        )

    @property
    def _tls(self) -> TlsSettings:
        return self.settings.tls


__all__ = ["Apis"]
