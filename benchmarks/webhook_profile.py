"""CPU per review of the pod webhook, in process and without a network (issue 33, item 3).

Why: wall-clock throughput on a shared 2-core machine says little about a change; the CPU one
review costs the webhook's process does, and it is what bounds requests per second on the one
core the webhook gets in `benchmarks/webhook.py`. This script starts the embedded API server
(`tfusion --role=apiserver`, its own process) seeded as webhook.py seeds it, runs the controller in
this process (`build_runtime`, `configure`, `serve_runtime`: the webhook with its informers and the
leader's index allocator), and then drives AdmissionReviews through the webhook's ASGI app
(`webhook_app(service.review)`, the route uvicorn calls, with an in-memory receive and send) one
after another: `--distinct` pods each with a name of its own and dryRun (as webhook.py's
distinct-pods case sends them: they share one memo entry by shape), `--repeated` identical pods
(one memo entry by bytes), and `--fresh` pods each with a label of its own (the first pod of its
shape: full analysis, rendering and JSON diff). Each figure is `time.process_time()` over the
batch divided by its size (the process's CPU, the controller's background tasks included; they are
idle here), the median of `--repeat` batches.

    .venv/bin/python benchmarks/webhook_profile.py [--distinct 3000] [--repeated 3000] [--fresh 1000]
                                                   [--repeat 3] [--profile 25] [--profile-case fresh]

Prints one JSON object: distinct_cpu_us, repeated_cpu_us, fresh_cpu_us (medians) and their runs, the
handler-only figures (`*_handler_cpu_us`: the review decoded, `service.review`, the answer
encoded; no ASGI route, no body receive), and with `--profile N` the top N functions of a cProfile
of one batch on stderr (`--profile-case distinct|repeated|fresh`, distinct by default). Exits
non-zero when a review is not answered allowed with a patch.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from _processes import free_ports, stop
from webhook import NAMESPACE, OPS, PATH, Api, review_body, seed, wait


def start_apiserver(tmp: Path) -> tuple[subprocess.Popen[bytes], Api, Path]:
    port = free_ports(1)[0]
    kubeconfig = tmp / "kubeconfig"
    log = open(tmp / "apiserver.log", "wb")  # noqa: SIM115  closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "tfusion", "--role=apiserver", "--apiserver-listen",
                             f"127.0.0.1:{port}", "--state", str(tmp / "state.db"), "--kubeconfig-out",
                             str(kubeconfig)], stdout=log, stderr=subprocess.STDOUT)
    wait("the API server's kubeconfig", kubeconfig.exists)
    api = Api(kubeconfig)
    wait("the API server", lambda: api.http.get("/readyz").status_code == 200)
    seed(api)
    return proc, api, kubeconfig


def scope_for(body: bytes) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "https", "path": PATH, "raw_path": PATH.encode(),
            "query_string": b"timeout=10s", "root_path": "", "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 443), "state": {},
            "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                        (b"accept", b"application/json"), (b"content-length", str(len(body)).encode())]}


async def through_app(app: Any, body: bytes) -> bytes:
    """One review through the ASGI route: the answer's body."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope_for(body), receive, send)
    status = sent[0].get("status")
    answer: bytes = sent[-1].get("body", b"")
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {answer[:300]!r}")
    return answer


def check(answer: bytes) -> None:
    if b'"allowed":true' not in answer or b'"patch":' not in answer:
        raise RuntimeError(f"not allowed with a patch: {answer[:400]!r}")


async def cpu_per_review(send: Callable[[bytes], Any], bodies: list[bytes]) -> float:
    """Microseconds of process CPU per review over `bodies`, sent one after another."""
    began = time.process_time()
    for body in bodies:
        check(await send(body))
    return (time.process_time() - began) / len(bodies) * 1e6


async def measure(args: argparse.Namespace, kubeconfig: Path, tmp: Path) -> dict[str, Any]:
    from tfusion.controller.role import build_runtime, configure, serve_runtime
    from tfusion.controller.webhook.server import AdmissionReviewAnswer, _encoder, decode_review, webhook_app
    from tfusion.settings import Settings

    settings = Settings(roles=("controller",), kube=str(kubeconfig), controller_listen="127.0.0.1:0",
                        health_probe_listen="127.0.0.1:0", webhook_listen="127.0.0.1:0",
                        dynamic_config=str(tmp / "config.yaml"), leader_elect=False, operator_namespace=OPS)
    runtime = await build_runtime(settings)
    configure(runtime)
    service = runtime.webhook
    assert service is not None
    app = webhook_app(service.review)

    async def handler(body: bytes) -> bytes:  # the review alone: no ASGI route, no body receive
        return _encoder.encode(AdmissionReviewAnswer(response=await service.review(decode_review(body))))

    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: serve_runtime(runtime, task_status=task_status))
        deadline = time.monotonic() + 60
        while True:  # informers synced and the index allocator leading
            try:
                check(await through_app(app, review_body("warm-up", dry_run=True)))
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                await anyio.sleep(0.2)
        serial = iter(range(10**9))

        def distinct(n: int) -> list[bytes]:
            return [review_body(f"bench-pod-{next(serial)}", dry_run=True) for _ in range(n)]

        def fresh(n: int) -> list[bytes]:  # a label of its own: no pod before had this shape
            return [review_body(f"bench-pod-{number}", dry_run=True).replace(b'"app": "bench"',
                                                                             b'"app": "bench-%d"' % number)
                    for number in (next(serial) for _ in range(n))]

        repeated = [review_body("bench-pod", dry_run=True)] * args.repeated
        await cpu_per_review(lambda b: through_app(app, b), distinct(200) + repeated[:200])  # warm
        runs: dict[str, list[float]] = {"distinct": [], "repeated": [], "fresh": [], "distinct_handler": [],
                                        "repeated_handler": []}
        for _ in range(args.repeat):
            runs["distinct"].append(await cpu_per_review(lambda b: through_app(app, b), distinct(args.distinct)))
            runs["repeated"].append(await cpu_per_review(lambda b: through_app(app, b), repeated))
            runs["fresh"].append(await cpu_per_review(lambda b: through_app(app, b), fresh(args.fresh)))
            runs["distinct_handler"].append(await cpu_per_review(handler, distinct(args.distinct)))
            runs["repeated_handler"].append(await cpu_per_review(handler, repeated))
        if args.profile:
            batches = {"distinct": lambda: distinct(args.distinct), "repeated": lambda: repeated,
                       "fresh": lambda: fresh(args.fresh)}
            bodies = batches[args.profile_case]()
            profiler = cProfile.Profile()
            profiler.enable()
            await cpu_per_review(lambda b: through_app(app, b), bodies)
            profiler.disable()
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("tottime").print_stats(args.profile)
            stats.sort_stats("cumulative").print_stats(args.profile)
            print(out.getvalue(), file=sys.stderr)
        tg.cancel_scope.cancel()
    result: dict[str, Any] = {f"{name}_cpu_us": round(statistics.median(values), 1) for name, values in runs.items()}
    result["runs"] = {name: [round(v, 1) for v in values] for name, values in runs.items()}
    result.update({"distinct": args.distinct, "repeated": args.repeated, "fresh": args.fresh, "repeat": args.repeat,
                   "namespace": NAMESPACE})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distinct", type=int, default=3000, help="distinct pods per batch")
    parser.add_argument("--repeated", type=int, default=3000, help="identical pods per batch")
    parser.add_argument("--fresh", type=int, default=1000, help="pods of a shape never seen before per batch")
    parser.add_argument("--repeat", type=int, default=3, help="batches of each kind")
    parser.add_argument("--profile", type=int, default=0, help="print the top N functions of a cProfile")
    parser.add_argument("--profile-case", choices=("distinct", "repeated", "fresh"), default="distinct",
                        help="with --profile: the kind of batch profiled")
    args = parser.parse_args()
    import logging

    from tfusion.api.documents import young_threshold_raised

    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="tfusion-bench-webhook-profile-") as directory:
        tmp = Path(directory)
        proc, _, kubeconfig = start_apiserver(tmp)
        try:
            with young_threshold_raised():  # as `tfusion`'s entry point runs a role
                result = anyio.run(measure, args, kubeconfig, tmp)
        finally:
            stop(proc)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
