"""`python -m tfusion` with what a benchmark needs to see inside it: the API server's requests
counted, the process profiled for a chosen stretch.

Why a wrapper and not a metric or flag of tfusion's: the embedded API server keeps no per-request
counters, and a benchmark must not change what it measures. `python benchmarks/_instrument.py
ARGS` runs the ordinary command line `tfusion ARGS`, and:

- with `TFUSION_BENCH_COUNT=1`, `ApiApp._http` is wrapped: each request
is counted by verb (create, update, patch, delete, get, list, watch) and resource (`pods`,
`pods/binding`, `tensorfusionworkloads/status`, ...), with `!` and the status code appended to
  the resource when the answer was not 2xx. `GET /tfusion-bench/requests` answers the counts so
  far as `{"verb resource": n}`, without counting itself;
- with `TFUSION_BENCH_PROFILE=<path>`, SIGUSR1 starts cProfile (timed by process CPU) on the main
  thread (the event loop) and SIGUSR2 stops it and writes its stats to <path> (pstats format).
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PATH = "/tfusion-bench/requests"
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def resource_of(path: str) -> tuple[str, bool]:
    """(resource[/subresource], names an object) of a kube REST path:
    /api/v1/[namespaces/<ns>/]<plural>[/<name>[/<sub>]] and /apis/<group>/<version>/... alike."""
    parts = [p for p in path.split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else parts
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]
    if not rest:
        return path, False
    return "/".join([rest[0], *rest[2:3]]), len(rest) >= 2


def verb_of(method: str, query: str, named: bool) -> str:
    if method == "GET":
        return "watch" if "watch=true" in query or "watch=1" in query else "get" if named else "list"
    return _VERBS.get(method, method.lower())


def install() -> Counter[str]:
    from tfusion.apiserver import app  # only here: the controller's process does not load the API server

    counts: Counter[str] = Counter()
    served = app.ApiApp._http

    async def counted(self: Any, scope: Any, receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        if path == PATH:
            body = orjson.dumps(dict(counts))
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        resource, named = resource_of(path)
        verb = verb_of(str(scope.get("method", "")), bytes(scope.get("query_string", b"")).decode(), named)
        status = [0]

        async def watched(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status[0] = int(message.get("status", 0))
            await send(message)

        try:
            await served(self, scope, receive, watched)
        finally:
            ok = 200 <= status[0] < 300
            counts[f"{verb} {resource}" if ok else f"{verb} {resource}!{status[0]}"] += 1

    app.ApiApp._http = counted  # type: ignore[method-assign]
    return counts


def profile_on_signals(path: str) -> None:
    profiler = cProfile.Profile(time.process_time)  # CPU, not wall-clock: others share the cores

    def start(*_: object) -> None:
        profiler.enable()

    def stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(path)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)


if __name__ == "__main__":
    if os.environ.get("TFUSION_BENCH_COUNT") == "1":
        install()
    if os.environ.get("TFUSION_BENCH_PROFILE"):
        profile_on_signals(os.environ["TFUSION_BENCH_PROFILE"])
    from tfusion.cli import main

    raise SystemExit(main())
