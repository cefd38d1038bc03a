"""The Ray Serve application, and `verispec serve --replicas N` / `--ray-address ADDR`.

    build_application(engine, server, cluster)  the application: Ingress -> Replica deployments
    build(args)                                 Ray Serve's app-builder form, for `serve run` and
                                                KubeRay's RayService (import_path verispec.cluster:build)
    run(engine, server, cluster)                the CLI: start (or join) a cluster, deploy, serve
                                                until interrupted, then delete the application
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
import typing
from typing import Any

from verispec.config import ClusterConfig, EngineConfig, ServerConfig, SpeculativeConfig
from verispec.errors import ConfigError


# Ray Serve settings for lower per-request and per-chunk cost: user code on the replica's own event
# loop, the handle's router on the caller's (Ray Serve's performance guide)
SERVE_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


def _require_ray():
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as e:
        raise ConfigError("replicas on Ray Serve need Ray: pip install 'verispec[cluster]' (ray[serve]==2.60.0)") from e


def build_application(engine: EngineConfig, server: ServerConfig, cluster: ClusterConfig):
    _require_ray()
    from ray import serve
    from ray.serve.config import AutoscalingConfig, RequestRouterConfig

    from verispec.cluster.ingress import Ingress
    from verispec.cluster.replica import Replica
    from verispec.cluster.routing import PrefixAffinityRouter

    max_ongoing = cluster.max_ongoing_requests or engine.max_num_seqs + server.max_waiting
    scale: dict[str, Any] = {"num_replicas": cluster.replicas or 1}
    if cluster.min_replicas is not None:
        scale = {"autoscaling_config": AutoscalingConfig(
            min_replicas=cluster.min_replicas, max_replicas=cluster.max_replicas,
            initial_replicas=max(cluster.min_replicas, 1), target_ongoing_requests=cluster.target_ongoing_requests,
        )}
    board = f"verispec-metrics-{cluster.app_name}"
    replica = serve.deployment(
        Replica, name="VerispecReplica", max_ongoing_requests=max_ongoing, ray_actor_options={"num_cpus": cluster.replica_cpus, "runtime_env": {"env_vars": SERVE_ENV}},
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter, request_router_kwargs={"imbalance": cluster.affinity_imbalance}),
        health_check_period_s=5, health_check_timeout_s=30, graceful_shutdown_timeout_s=5, **scale,
    ).bind(engine, server, board)
    ingress = serve.deployment(
        Ingress, name="VerispecIngress", num_replicas=1, ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": SERVE_ENV}},
        max_ongoing_requests=max(1000, 4 * max_ongoing),
    ).bind(replica, board, server.max_request_bytes)
    return ingress


def build(args: dict[str, Any]):
    """Ray Serve app builder: `args` holds EngineConfig, SpeculativeConfig, ServerConfig and
    ClusterConfig fields by name (as the CLI's flags, with underscores)."""
    def pick(cls, **extra):
        hints = typing.get_type_hints(cls)
        values = {k: _coerce(v, hints[k]) for k, v in args.items() if k in hints and k != "speculative"}
        return cls(**values, **extra)

    unknown = set(args) - {f.name for cls in (EngineConfig, SpeculativeConfig, ServerConfig, ClusterConfig)
                           for f in dataclasses.fields(cls)}
    if unknown:
        raise ConfigError(f"unknown verispec options: {', '.join(sorted(unknown))}")
    engine = pick(EngineConfig, speculative=pick(SpeculativeConfig))
    return build_application(engine, pick(ServerConfig), pick(ClusterConfig))


def _coerce(value: Any, tp: Any) -> Any:
    """`serve run verispec.cluster:build replicas=2` passes strings: read them as the field's type."""
    if not isinstance(value, str):
        return value
    kinds = [t for t in typing.get_args(tp) or (tp,) if t is not type(None)]
    if value.lower() in ("none", "null") and type(None) in typing.get_args(tp):
        return None
    for kind in kinds:
        if kind is bool and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        if kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                continue
    return value


def run(engine: EngineConfig, server: ServerConfig, cluster: ClusterConfig) -> int:
    """Deploy and serve until SIGINT/SIGTERM (the CLI's `serve` with cluster options)."""
    _require_ray()
    import ray
    from ray import serve

    started_here = cluster.ray_address is None
    if started_here:
        # Ray starts its workers at nice 15: a replica's engine would then yield the cores to Ray's own
        # processes and the HTTP client (docs/results/cluster/README.md)
        os.environ.setdefault("RAY_worker_niceness", "0")
        for name, value in SERVE_ENV.items():  # the proxy's too
            os.environ.setdefault(name, value)
        ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    else:
        if "RAY_AUTH_MODE" not in os.environ and (os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(os.path.expanduser("~/.ray/auth_token"))):
            os.environ["RAY_AUTH_MODE"] = "token"  # Ray's token authentication, which its local clusters use by default
        ray.init(address=cluster.ray_address, log_to_driver=False, logging_level="WARNING")
    stopping: list[int] = []  # a plain flag: a handler must not take a lock the main thread may hold
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stopping.append(signum))
    try:
        serve.start(http_options={"host": server.host, "port": server.port})
        n = f"{cluster.min_replicas}-{cluster.max_replicas} (autoscaling)" if cluster.min_replicas is not None else cluster.replicas or 1
        print(f"verispec: deploying {engine.model} as {n} replicas on Ray ({ray.get_runtime_context().gcs_address}); "
              "the endpoint answers once the first replica has loaded", file=sys.stderr)
        serve.run(build_application(engine, server, cluster), name=cluster.app_name, route_prefix="/", blocking=False)
        print(f"verispec: serving {engine.model} on http://{server.host}:{server.port}/v1", file=sys.stderr)
        while not stopping:
            time.sleep(0.2)
    finally:
        if not started_here:  # our application leaves the shared cluster (bounded: the cluster may be going down too)
            leaving = threading.Thread(target=serve.delete, args=(cluster.app_name,), daemon=True)
            leaving.start()
            leaving.join(30)
        ray.shutdown()  # a cluster started here stops with it (Ctrl-C has signalled its processes too)
    return 0
