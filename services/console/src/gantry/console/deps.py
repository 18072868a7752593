"""What a page handler asks for: the viewer (logged in, or sent to the login page) and the APIs."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gantry.console.apis import Apis
from gantry.console.viewer import COOKIE, Gatekeeper, Viewer
from gantry.core import Unauthenticated


class LoginRequired(Exception):
    """No valid login: the page answers with the login form (and why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def current_viewer(request: Request) -> Viewer:
    """The logged-in viewer; :class:`LoginRequired` when there is none or the token is bad."""
    gatekeeper: Gatekeeper = request.app.state.gatekeeper
    try:
        viewer = gatekeeper.viewer(request.cookies.get(COOKIE))
    except Unauthenticated as exc:
        raise LoginRequired(exc.message) from None
    request.state.viewer = viewer
    return viewer


def current_apis(request: Request) -> Apis:
    """The services' APIs."""
    apis: Apis = request.app.state.apis
    return apis


ViewerDep = Annotated[Viewer, Depends(current_viewer)]
ApisDep = Annotated[Apis, Depends(current_apis)]

__all__ = ["ApisDep", "LoginRequired", "ViewerDep", "current_apis", "current_viewer"]
