"""ASGI middleware: the Host allow-list, a hard cap on request bodies, and the per-route request
counter.

The body is read up front (it is small by construction) so an oversize one is refused with 413
before any handler, validation or queueing sees it, whether or not it announced its length.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bmoe.server.errors import error_body
from bmoe.server.hosts import HostCheck


async def _send_json(send: Send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def host_refusal(header: str | None) -> dict:
    shown = (header or "")[:100]
    return error_body(
        400,
        f"Host {shown!r} is not allowed: bmoe-server answers only localhost, loopback addresses, "
        f"its --host and the names in --allowed-hosts",
        None,
        "host_not_allowed",
    )


class AllowedHosts:
    """Refuse (400) a request whose Host header names no host this server answers (hosts.py)."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app, self.check = app, HostCheck(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.check.any:
            await self.app(scope, receive, send)
            return
        hosts = [v for k, v in scope["headers"] if k.lower() == b"host"]
        header = hosts[0].decode("latin-1") if len(hosts) == 1 else None
        if not self.check.allows(header):
            await _send_json(send, 400, host_refusal(header))
            return
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = error_body(
            413, f"the request body is over the server's limit of {self.max_bytes} bytes", None, "body_too_large"
        )
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_json(send, 413, too_big)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, too_big)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: disconnect notices, as the app expects

        await self.app(scope, replay, send)


class CountRequests:
    """bmoe_http_requests{route,status}; unknown paths count as "other" (fuzzers make many)."""

    def __init__(self, app: ASGIApp, routes: Callable[[], Collection[str]], count: Callable[[str, int], None]) -> None:
        self.app, self.routes, self.count = app, routes, count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in self.routes() else "other"

        async def counting_send(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                self.count(route, int(msg["status"]))
            await send(msg)

        await self.app(scope, receive, counting_send)
