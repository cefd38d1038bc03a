"""Several engines behind one OpenAI endpoint, on Ray Serve (the optional extra `.[cluster]`).

    ingress.py   the HTTP entry: reads, routes, retries a request whose replica failed before
                 answering, passes responses and streams through, serves the merged /metrics
    replica.py   one engine per replica, answering through the single-process server's own app
    routing.py   prefix affinity (a conversation's turns, a shared system prompt) as a Ray Serve
                 request router
    metrics.py   every replica's Prometheus series with a `replica` label
    app.py       the application, its app-builder `build` (for `serve run` and KubeRay), and the CLI

Ray is imported only when an application is built or run.
"""

from verispec.cluster.app import build, build_application, run

__all__ = ["build", "build_application", "run"]
