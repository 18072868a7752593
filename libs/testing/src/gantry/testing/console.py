"""Stand-ins for the console's unit tests: the services' clients as plain objects.

The console's pages open clients through ``Apis`` (one factory per service). In unit tests,
:class:`FakeApis` takes its place: a test sets ``apis.factories["scheduler"] = lambda viewer:
Closing(my_object)`` and the page calls ``my_object``'s methods. The browser tests
(``tests/console``) run the real platform instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The origin the unit tests' client sends (the console checks it on every write).
ORIGIN = "http://testserver"


class FakeApis:
    """Stands in for ``gantry.console.apis.Apis``: each attribute named after a service is a
    factory ``(viewer) -> client``, taken from :attr:`factories`; :attr:`calls` records
    ``(service, subject)`` for every client opened."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.calls: list[tuple[str, str]] = []
        self.factories: dict[str, Callable[[Any], Any]] = {}

    def __getattr__(self, service: str) -> Callable[[Any], Any]:
        factories = self.__dict__.get("factories", {})
        if service not in factories:
            raise AttributeError(service)

        def open_for(viewer: Any) -> Any:
            self.calls.append((service, viewer.subject))
            return factories[service](viewer)

        return open_for


class Closing:
    """Wraps a stand-in client so ``with apis.x(viewer) as client`` works."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __enter__(self) -> Any:
        return self.inner

    def __exit__(self, *exc: object) -> None:
        return None


__all__ = ["ORIGIN", "Closing", "FakeApis"]
