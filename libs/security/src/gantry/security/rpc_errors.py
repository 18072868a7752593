"""Gantry's typed errors as gRPC status codes, for servicer methods.

A handler raises :class:`~gantry.core.GantryError` subclasses; these decorators end the call
with the status code the error names (``grpc_code``) and its message (with the hint), so a
client sees what went wrong and what to do — never an UNKNOWN with a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from gantry.core import GantryError

R = TypeVar("R")


async def abort_with(context: grpc.aio.ServicerContext, exc: GantryError) -> None:
    """End the call with ``exc``'s status code and message (raises, as ``abort`` does)."""
    await context.abort(getattr(grpc.StatusCode, exc.grpc_code), str(exc))


def rpc_errors(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """For unary-response methods ``async def M(self, request, context)``."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, request, context)
        except GantryError as exc:
            await abort_with(context, exc)
            raise  # unreachable: abort raises

    return wrapper


def stream_rpc_errors(fn: Callable[..., AsyncIterator[R]]) -> Callable[..., AsyncIterator[R]]:
    """For server-streaming methods (async generators)."""

    @functools.wraps(fn)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[R]:
        try:
            async for item in fn(self, request, context):
                yield item
        except GantryError as exc:
            await abort_with(context, exc)

    return wrapper


__all__ = ["abort_with", "rpc_errors", "stream_rpc_errors"]
