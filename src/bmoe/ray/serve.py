"""bmoe-server's FastAPI app as a Ray Serve deployment: one Session per replica.

Each replica opens its own Session from the SessionConfig and builds the app with the same
``create_app`` bmoe-server runs, so the routes, the auth (``ServerSettings.api_key``), the refusals
and the metrics are the same. A replica takes at most ``max_queue + 1`` requests at once (the one
its session runs and the ones its own queue holds), so Serve sends no request that the app would
refuse with 503 while another replica has room.

Routing is Serve's default (power of two choices on queue length). Its prefix-aware router
(``ray.serve.llm.request_router.PrefixCacheAffinityRouter``) reads a ``prompt`` or ``messages``
attribute off a handle call's argument; requests that come in over HTTP reach the router as the
proxy's raw, still-pickled request, so there is no text to match (docs/scale-out.md).
"""

from __future__ import annotations

import shlex
from typing import Any

from bmoe.config import SessionConfig
from bmoe.errors import ConfigError
from bmoe.flags import config_from_flags, model_from_flags
from bmoe.ray.data.run import RayOptions, actor_config, sizing
from bmoe.server.app import ServerSettings, close_app, create_app
from bmoe.server.main import build_server_parser, server_settings
from bmoe.session import Session
from ray import serve


@serve.ingress()
class BmoeReplica:
    """One replica: its Session, and the app over it (built after the session opened)."""

    def __init__(self, config: dict[str, Any], settings: ServerSettings) -> None:
        self.session = Session(SessionConfig(**config))
        self.settings = settings
        self._bmoe_app: Any = None  # (``app`` is a property of Serve's ingress wrapper)

    def __serve_build_asgi_app__(self) -> Any:
        self._bmoe_app = create_app(self.session, self.settings)
        return self._bmoe_app

    def __del__(self) -> None:  # Serve calls it when the replica shuts down
        if getattr(self, "_bmoe_app", None) is not None:
            close_app(self._bmoe_app)
        if getattr(self, "session", None) is not None:
            self.session.close()


def deployment(
    config: SessionConfig,
    settings: ServerSettings = ServerSettings(),
    *,
    replicas: int = 1,
    num_cpus: float = 1.0,
    memory_mb: int | None = None,
    flash_resource: str | None = None,
    max_queued_requests: int = -1,
) -> Any:
    """The bound Serve application: ``serve.run(deployment(cfg), route_prefix="/")``. Each replica
    reserves what a bmoe-batch actor does (docs/scale-out.md "Resource sizing")."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"replicas: must be an integer >= 1, got {replicas!r}")
    options = RayOptions(actors=replicas, num_cpus=num_cpus, memory_mb=memory_mb, flash_resource=flash_resource)
    size = sizing(config, options)
    actor_options: dict[str, Any] = {"num_cpus": size.num_cpus, "memory": size.memory}
    if size.resources:
        actor_options["resources"] = size.resources
    dep = serve.deployment(
        BmoeReplica,
        name="bmoe",
        num_replicas=replicas,
        ray_actor_options=actor_options,
        max_ongoing_requests=settings.max_queue + 1,
        max_queued_requests=max_queued_requests,
    )
    return dep.bind(actor_config(config, options), settings)  # type: ignore[attr-defined]  # serve's stubs type the decorator, not Deployment


def build(args: dict[str, str]) -> Any:
    """An application builder for ``serve run bmoe.ray.serve:build flags="-m model.gguf ..."
    replicas=2``: ``flags`` are bmoe-server's flags (session flags, --api-key, --max-queue,
    --allowed-hosts, --max-body-kb, --no-decide; --host and --port are Serve's to set); the other
    keys are ``replicas``, ``num_cpus``, ``memory_mb``, ``flash_resource``."""
    known = {"flags", "replicas", "num_cpus", "memory_mb", "flash_resource"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ConfigError(f"unknown argument(s) {', '.join(unknown)}; give {', '.join(sorted(known))}")
    flags, extra = build_server_parser().parse_known_args(shlex.split(args.get("flags", "")))
    settings = ServerSettings(**server_settings(flags, extra))  # bmoe-server's checks, as ConfigError
    cfg = config_from_flags(flags, model_from_flags(flags, "bmoe.ray.serve"), decide=not flags.no_decide)
    memory = args.get("memory_mb")
    return deployment(
        cfg,
        settings,
        replicas=int(args.get("replicas", 1)),
        num_cpus=float(args.get("num_cpus", 1.0)),
        memory_mb=int(memory) if memory else None,
        flash_resource=args.get("flash_resource") or None,
    )
