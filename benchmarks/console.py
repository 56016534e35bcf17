"""Server time of every console page at 1,000 nodes, 4,000 GPUs and 10,000 pods (issue 31: under 300 ms).

The console's pages read a cache, so what a page costs is the view model and the template over
that many objects, not the cluster. This benchmark builds the synthetic cluster of
tests/helpers/console_cluster.py (the same objects the console's unit tests check), wraps it in a
`StaticCluster`, builds the console app and requests each page in process through
`httpx.ASGITransport`: no socket and no server loop in the figures, only the app's own time.

Three requests per page, each timed `--repeat` times after two untimed warm-ups:
the full page (`pages`), its live fragment (`fragments`: what the browser polls for once a
second after a change), and the same fragment when nothing changed (`unchanged`: the poll's
usual answer, 204). The controller is not given (`controller=None`): the console then shows that
it cannot reach one, so the usage columns are empty; asking a real controller for /api/usage and
/api/why is a network round-trip this benchmark does not measure.

    .venv/bin/python benchmarks/console.py [--nodes 1000] [--gpus-per-node 4] [--pods 10000]
                                           [--pending 50] [--repeat 30] [--metrics-dir DIR]

Prints one JSON object: nodes, gpus, pods (bound), pending, build_s (making the objects),
target_ms, samples, controller, pages / fragments / unchanged: path -> p50_ms, p90_ms, p99_ms,
max_ms, status, bytes; and over_target: the paths whose full-page p99 exceeds target_ms. Exits 1
when a request fails (any status but 200 for a page and a fragment, or 200/204 for unchanged).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.console_cluster import synthetic_cluster
from tfusion.api.documents import freeze_long_lived
from tfusion.console.cache import StaticCluster
from tfusion.kube import resources as r

TARGET_MS = 300.0
#: every page, and the variants a user reaches from it that read a different slice of the cluster
PAGES = ("/", "/gpus", "/workloads", "/workloads?sort=cost", "/pending", "/quotas", "/events", "/usage")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Asgi = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


@asynccontextmanager
async def lifespan(app: Asgi) -> AsyncIterator[None]:
    """The app's start-up and shutdown hooks around the requests (ASGITransport sends no lifespan)."""
    incoming: asyncio.Queue[Message] = asyncio.Queue()
    outgoing: asyncio.Queue[Message] = asyncio.Queue()

    async def run() -> None:
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, incoming.get, outgoing.put)

    task = asyncio.create_task(run())
    await incoming.put({"type": "lifespan.startup"})
    started = await outgoing.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the console app did not start: {started}")
    try:
        yield
    finally:
        await incoming.put({"type": "lifespan.shutdown"})
        await outgoing.get()
        await task


def summary(samples_ms: list[float], status: int, size: int) -> dict[str, Any]:
    ordered = sorted(samples_ms)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"p50_ms": round(statistics.median(ordered), 2), "p90_ms": pick(0.9), "p99_ms": pick(0.99),
            "max_ms": round(ordered[-1], 2), "status": status, "bytes": size}


async def time_get(client: httpx.AsyncClient, url: str, repeat: int) -> tuple[list[float], httpx.Response]:
    for _ in range(2):  # warm-up: template compilation, first-use caches
        response = await client.get(url)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = await client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
    return samples, response


def with_query(path: str, **params: str) -> str:
    joiner = "&" if "?" in path else "?"
    return path + joiner + "&".join(f"{k}={v}" for k, v in params.items())


async def measure(app: Asgi, *, paths: tuple[str, ...] = PAGES, repeat: int = 30) -> tuple[dict[str, Any], list[str]]:
    """(pages, fragments, unchanged timings; failures) for `paths` of an ASGI console app."""
    result: dict[str, Any] = {"pages": {}, "fragments": {}, "unchanged": {}}
    failures: list[str] = []
    transport = httpx.ASGITransport(app=app)
    async with lifespan(app), httpx.AsyncClient(transport=transport, base_url="http://console",
                                                 timeout=60) as client:
        for path in paths:
            for kind, url, ok in (("pages", path, (200,)), ("fragments", with_query(path, fragment="1"), (200,))):
                samples, response = await time_get(client, url, repeat)
                result[kind][path] = summary(samples, response.status_code, len(response.content))
                if response.status_code not in ok:
                    failures.append(f"GET {url}: {response.status_code} {response.text[:300]}")
            etag = response.headers.get("etag", "").strip('"')
            url = with_query(path, fragment="1", since=etag)
            samples, response = await time_get(client, url, repeat)
            result["unchanged"][path] = summary(samples, response.status_code, len(response.content))
            if response.status_code not in (200, 204):
                failures.append(f"GET {url}: {response.status_code} {response.text[:300]}")
    return result, failures


def console_app(cluster: StaticCluster, metrics_dir: Path | None) -> Asgi:
    """The lead's app as `tfusion console` builds it, without a controller."""
    from tfusion.console.app import console_app as make

    history = None
    if metrics_dir is not None:
        from tfusion.console.history import file_history

        history = file_history(metrics_dir)
    app: Asgi = make(cluster, controller=None, history=history)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=4)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--pending", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=30, help="timed requests per URL (default 30)")
    parser.add_argument("--metrics-dir", type=Path, default=None,
                        help="metrics files for the usage page's charts (default: none; the page says so)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat} is not allowed; expected at least 1")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    started = time.perf_counter()
    objects = synthetic_cluster(nodes=args.nodes, gpus_per_node=args.gpus_per_node, pods=args.pods,
                                pending=args.pending)
    build_s = time.perf_counter() - started
    cluster = StaticCluster(objects)
    freeze_long_lived()  # as `tfusion console`'s informers do once they have listed a cluster this size
    gc.collect()  # the objects' garbage is not billed to the first page
    timings, failures = asyncio.run(measure(console_app(cluster, args.metrics_dir), repeat=args.repeat))
    bound = sum(1 for p in objects[r.PODS] if p["spec"].get("nodeName"))
    report = {
        "nodes": len(objects[r.NODES]), "gpus": len(objects[r.GPUS]), "pods": bound,
        "pending": len(objects[r.PODS]) - bound, "build_s": round(build_s, 2), "target_ms": TARGET_MS,
        "samples": args.repeat, "controller": "none: the pages say the controller is not reachable",
        **timings,
        "over_target": [path for path, t in timings["pages"].items() if t["p99_ms"] > TARGET_MS],
    }
    if failures:
        report["failures"] = failures
    print(json.dumps(report))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
