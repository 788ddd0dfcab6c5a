"""create_app(): the FastAPI app over one open Session.

The caller owns the session (opens it before, closes it after); the app owns the worker thread
that feeds it (``app.state.queue``; ``close_app`` stops it).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST

from bmoe.server.chat_route import ChatRoute
from bmoe.server.completions_route import CompletionsRoute
from bmoe.server.decide_route import DecideRoute
from bmoe.server.errors import ApiError, error_response, install_handlers
from bmoe.server.job_queue import JobQueue, QueueFull
from bmoe.server.metrics import Metrics
from bmoe.server.middleware import AllowedHosts, BodyLimit, CountRequests
from bmoe.server.tokenizer_route import tokenizer_router
from bmoe.session import Session

# The page's files; a fixed list, so no request path ever reaches the filesystem.
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# Paths the request counter names; anything else counts as "other" (a fuzzer makes many).
ROUTES = frozenset(
    {
        "/",
        "/health",
        "/metrics",
        "/v1/models",
        "/v1/session",
        "/v1/chat/completions",
        "/v1/decide",
        "/openapi.json",
        "/v1/completions",
        "/tokenize",
        "/detokenize",
        "/tokenizer_info",
        *(f"/static/{name}" for name in STATIC),
    }
)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    api_key: str | None = None  # None: no auth
    max_queue: int = 8  # requests that may wait behind the running one
    max_body_bytes: int = 1 << 20
    # /v1/decide: the most decisions one request may run (bmoe.decide.debias.decisions_needed)
    max_request_decisions: int = 32
    # Host names answered besides localhost and loopback addresses ("*": every one); hosts.py.
    allowed_hosts: tuple[str, ...] = ()


def model_id(session: Session) -> str:
    return Path(session.config.model).stem


def session_info(session: Session, settings: ServerSettings, queue: JobQueue) -> dict[str, Any]:
    """The model and session settings, read-only, for the page (no filesystem paths)."""
    cfg = session.config
    conf = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "model"}
    conf = {k: (Path(v).name if isinstance(v, Path) else v) for k, v in conf.items()}  # no paths
    return {
        "model": model_id(session),
        "arch": session.model.arch,
        "n_ctx": session.n_ctx,
        "n_expert_used": session.model.n_expert_used,
        "think_ctl": session.chat.think_ctl,
        "decide": session.decider is not None,
        "streaming": cfg.moe_stream,
        "config": conf,
        "server": {
            "max_queue": settings.max_queue,
            "max_body_bytes": settings.max_body_bytes,
            "auth": settings.api_key is not None,
        },
        "stats": queue.last_stats,
    }


def _auth(settings: ServerSettings):
    bearer = HTTPBearer(auto_error=False, description="the server's --api-key")

    async def check(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if settings.api_key is None:
            return
        if creds is None or not secrets.compare_digest(creds.credentials.encode(), settings.api_key.encode()):
            raise ApiError(
                401,
                "a valid API key is required: send Authorization: Bearer <key>",
                None,
                "invalid_api_key",
                {"WWW-Authenticate": "Bearer"},
            )

    return check


def create_app(session: Session, settings: ServerSettings = ServerSettings()) -> FastAPI:
    metrics = Metrics(lambda: queue.depth(), lambda: queue.last_stats)
    queue = JobQueue(session, settings.max_queue, on_drop=metrics.cancelled.inc)  # a waiter whose client left
    # No /docs or /redoc: their pages load their scripts from a CDN, blank on an offline machine.
    # The schema itself is an API route below, behind the key like the others.
    app = FastAPI(
        title="bmoe-server",
        version="0.1.0",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        description="OpenAI-compatible chat and bmoe decisions over one bmoe session.",
    )
    app.state.queue, app.state.metrics, app.state.session = queue, metrics, session
    install_handlers(app)

    @app.exception_handler(QueueFull)
    async def _busy(_: Request, e: QueueFull) -> JSONResponse:
        metrics.rejected.inc()
        return error_response(ApiError(503, str(e), None, "queue_full", {"Retry-After": str(e.retry_after)}))

    api = APIRouter(dependencies=[Depends(_auth(settings))])
    busy: dict[int | str, dict[str, Any]] = {503: {"description": "the queue is full (Retry-After says when to retry)"}}
    api.add_api_route(
        "/v1/chat/completions",
        ChatRoute(queue, metrics, model_id(session)),
        methods=["POST"],
        summary="OpenAI chat completion (stream=true for SSE)",
        responses=busy,
    )
    api.add_api_route(
        "/v1/decide",
        DecideRoute(queue, metrics, settings.max_request_decisions),
        methods=["POST"],
        summary="One decision, or a list answered in order",
        responses=busy,
    )
    api.add_api_route(
        "/v1/completions",
        CompletionsRoute(queue, metrics, model_id(session)),
        methods=["POST"],
        summary="OpenAI legacy completion over raw prompts: scored (max_tokens 0 or 1) or generated (stream=true for SSE)",
        responses=busy,
    )
    api.include_router(tokenizer_router(queue))

    @api.get("/v1/models", summary="The one model this server serves")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_id(session),
                    "object": "model",
                    "created": int(started),
                    "owned_by": "bmoe",
                    "meta": session_info(session, settings, queue),
                }
            ],
        }

    @api.get("/v1/session", summary="Model and session settings, read-only, and the latest stats")
    async def info() -> dict[str, Any]:
        return session_info(session, settings, queue)

    @api.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    app.include_router(api)

    @app.get("/health", summary="Liveness; never needs the API key", responses={503: {"description": "broken"}})
    async def health() -> Any:
        if queue.broken is not None:  # the session hit an error it cannot recover from
            return JSONResponse({"status": "error", "error": queue.broken, "queue": queue.depth()}, 503)
        return {"status": "ok", "queue": queue.depth()}

    # The page is public (it holds no data and asks for the key itself); every API route is not.
    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return _static("index.html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        return _static(name)

    started = time.time()
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(AllowedHosts, allowed=settings.allowed_hosts)  # before the body is read; counted
    app.add_middleware(
        CountRequests,
        routes=lambda: ROUTES,
        count=lambda route, status: metrics.requests.labels(route, str(status)).inc(),
    )
    return app


def _static(name: str) -> Response:
    if name not in STATIC:
        return error_response(ApiError(404, f"no such file: {name[:60]}", None, "not_found"))
    try:
        data = resources.files("bmoe.server").joinpath("static", name).read_bytes()
    except FileNotFoundError:  # an install that left the package data out
        return error_response(ApiError(404, f"the page's file {name} is not installed", None, "not_installed"))
    return Response(data, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})


def close_app(app: FastAPI) -> None:
    app.state.queue.close()
