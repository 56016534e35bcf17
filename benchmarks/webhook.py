"""Pod webhook throughput and latency against a bare TLS echo endpoint (issue 12, item 8).

Processes: the embedded API server (`tfusion --role=apiserver`) with a default GPUPool, a
ProviderConfig and a GPUResourceQuota whose `single.defaultRequests/defaultLimits` give the pod its
TFLOPS and VRAM; the webhook in its own process (`tfusion --role=controller`, which serves it on
`--webhook-listen` with the certificate it keeps in the Secret); a bare Litestar endpoint in a third
process, served by the same edge (`webhook_app`, uvicorn, the same certificate and TLS settings)
that answers every review with an allowed AdmissionResponse; and the load: `wrk` (Debian's
package) with one thread holding `concurrency` keep-alive TLS connections, or without it (or with
`--load python`) `--clients` Python processes sharing them. Either posts, as fast as answers come
back, the AdmissionReview of a full TensorFusion pod (soft isolation, 2 GPUs, resources from the
quota defaults) and counts answers that are not HTTP 200 with `"allowed":true` as errors. The
pod's workload is created by the first review and already matches afterwards, so the load costs no
API call per pod: `workload_writes` counts the workload's resourceVersion changes during the timed
runs (expected 0). Every review after the first is answered from the webhook's memo of identical
pods (memo.py), as a Deployment's replicas are; each still gets its index and its workload check.

    .venv/bin/python benchmarks/webhook.py [--duration 10] [--concurrency 10,100] [--load wrk|python]
                                           [--repeat 3]

Prints one JSON object per concurrency: concurrency, requests_per_s, p50_ms, p90_ms, p99_ms,
echo_requests_per_s, ratio_to_echo, each the median of `--repeat` alternating webhook/echo runs
(`runs` lists them), and errors, echo_p99_ms, workload_writes, load, cpus, pinned; with wrk
also `distinct_pods_*` and `first_pods_*`, each the median of `--repeat` runs (listed in `runs`).
`distinct_pods_*` is the same load of pods each with a name of its own (dryRun, so that they
create no workload each). Such pods (named, no controller) share one memo entry by their shape,
the pod without its name (service.py, `_mutate_shared`), so this is what a bare pod costs once a
pod of its shape has been seen; what the first pod of a shape costs (full analysis, rendering,
JSON diff) is `first_pods_*`: each pod also has an env value of its own, so no memo entry
answers it (the memo keeps a shape only from its second pod on; `fresh_cpu_us` in
benchmarks/webhook_profile.py is its CPU in-process). The load
runs on other CPUs than the two servers under test (CPU 0) when there are two or more (`pinned`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import multiprocessing
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from _processes import free_ports, stop

NAMESPACE = "bench"
OPS = "tensor-fusion-sys"
POOL = "bench-pool"
PATH = "/mutate-v1-pod"


#: with two or more CPUs the servers under test (webhook, echo) share CPU 0 and everything else
#: (wrk or the Python clients, the API server, this script) runs on the others, so that the load
#: generator and the server never take turns on one core
CPUS = sorted(os.sched_getaffinity(0))
PINNED = len(CPUS) >= 2
SERVER_CPUS, OTHER_CPUS = ({CPUS[0]}, set(CPUS[1:])) if PINNED else (set(CPUS), set(CPUS))


def on_server_cpus() -> None:
    os.sched_setaffinity(0, SERVER_CPUS)


# --- the cluster -----------------------------------------------------------------------------------


class Api:
    """The embedded API server's kubeconfig, as an httpx client."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        self.http = httpx.Client(base_url=cluster["server"], headers={"authorization": f"Bearer {user['token']}"},
                                 verify=ssl.create_default_context(cadata=ca), timeout=30)

    def create(self, path: str, body: dict[str, Any]) -> None:
        response = self.http.post(path, json=body)
        if response.status_code not in (200, 201, 409):
            raise RuntimeError(f"POST {path}: {response.status_code} {response.text[:300]}")

    def get(self, path: str) -> dict[str, Any]:
        response = self.http.get(path)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def version(self, path: str) -> str | None:
        """The object's resourceVersion; None when it is gone."""
        response = self.http.get(path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return str(response.json()["metadata"]["resourceVersion"])


def wait(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (httpx.HTTPError, OSError, KeyError, ValueError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def seed(api: Api) -> None:
    from tfusion.api.crds import all_crds

    for crd in all_crds():
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    wait("the CRDs served", lambda: api.get("/apis/tensor-fusion.ai/v1/gpupools") is not None)
    for ns in (OPS, NAMESPACE):
        api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    tf = "/apis/tensor-fusion.ai/v1"
    api.create(f"{tf}/gpupools", {"metadata": {"name": POOL, "annotations": {"tensor-fusion.ai/is-default-pool":
                                                                              "true"}},
                                  "spec": {"nodeManagerConfig": {}}})
    api.create(f"{tf}/providerconfigs", {"metadata": {"name": "nvidia"}, "spec": {
        "vendor": "NVIDIA", "images": {"middleware": "tensorfusion/vgpu-provider-nvidia:latest"},
        "inUseResourceNames": ["nvidia.com/gpu"]}})
    api.create(f"{tf}/namespaces/{NAMESPACE}/gpuresourcequotas", {"metadata": {"name": "quota"}, "spec": {
        "single": {"defaultRequests": {"tflops": "20", "vram": "8Gi"},
                   "defaultLimits": {"tflops": "40", "vram": "8Gi"}}}})


def review_body(name: str = "bench-pod", *, dry_run: bool = False, epochs: str = "10") -> bytes:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"tensor-fusion.ai/enabled": "true",
                                                                                "app": "bench"},
                        "annotations": {"tensor-fusion.ai/gpu-count": "2", "tensor-fusion.ai/isolation": "soft"}},
           "spec": {"containers": [{"name": "app", "image": "pytorch/pytorch:latest",
                                    "command": ["python", "train.py"],
                                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                                    "env": [{"name": "EPOCHS", "value": epochs}]}],
                    "restartPolicy": "Never"}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "4c4ab2b3-1e58-4e5a-9d2b-8d0e3c2f0a11", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": NAMESPACE, "name": name, "object": pod, "dryRun": dry_run,
        "userInfo": {"username": "system:admin"}, "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}}
    return json.dumps(review).encode()


# --- the echo endpoint -----------------------------------------------------------------------------------


def serve_echo(port: int, cert_pem: bytes, key_pem: bytes) -> None:
    """A bare endpoint on the webhook's edge: decode the review, answer allowed."""
    import anyio

    from tfusion.controller.webhook.certs import load_into, tls_context
    from tfusion.controller.webhook.server import AdmissionRequest, AdmissionResponse, allowed, webhook_app
    from tfusion.web import bind_socket, serve

    on_server_cpus()
    context = tls_context()
    load_into(context, cert_pem, key_pem)

    async def echo(request: AdmissionRequest) -> AdmissionResponse:
        return allowed(request.uid)

    async def main() -> None:
        await serve(webhook_app(echo, title="echo"), bind_socket(f"127.0.0.1:{port}"),
                    uvicorn_options={"ssl_context_factory": lambda config, default: context})

    anyio.run(main)


# --- the load -----------------------------------------------------------------------------------------------


def _request(port: int, body: bytes) -> bytes:
    head = (f"POST {PATH}?timeout=10s HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _connection(port: int, request: bytes, context: ssl.SSLContext, until: float,
                      latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
    try:
        while time.monotonic() < until:
            began = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            payload = await reader.readexactly(length)
            latencies.append(time.perf_counter() - began)
            if not head.startswith(b"HTTP/1.1 200") or b'"allowed":true' not in payload:
                errors.append(1)
    finally:
        writer.close()


def _client(port: int, connections: int, duration: float, ca_pem: str, start_at: float,
            queue: Any) -> None:
    """One load process: `connections` keep-alive connections until `start_at + duration`."""
    context = ssl.create_default_context(cadata=ca_pem)
    request = _request(port, review_body())
    latencies: list[float] = []
    errors: list[int] = []

    async def main() -> None:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        until = time.monotonic() + duration
        await asyncio.gather(*(_connection(port, request, context, until, latencies, errors)
                               for _ in range(connections)))

    try:
        asyncio.run(main())
    except OSError:  # the server does not listen yet (the readiness wait asks again): no answer is an error
        errors.append(1)
    queue.put((latencies, len(errors)))


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json"
local file = io.open(os.getenv("TFUSION_BENCH_BODY"), "rb")
wrk.body = file:read("*a")
file:close()
-- distinct pods: "@N@" in the body becomes a number of its own in every request
if os.getenv("TFUSION_BENCH_DISTINCT") == "1" then
  local sent = 0
  function request()
    sent = sent + 1
    return wrk.format(nil, nil, nil, (string.gsub(wrk.body, "@N@", tostring(sent))))
  end
end
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) bad = 0 end
function response(status, headers, body)
  if status ~= 200 or not string.find(body, '"allowed":true', 1, true) then bad = bad + 1 end
end
function done(summary, latency, requests)
  local refused = 0
  for _, thread in ipairs(threads) do refused = refused + thread:get("bad") end
  local e = summary.errors
  io.write(string.format('{"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"mean_us": %f, "errors": %d}\\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency.mean,
    e.connect + e.read + e.write + e.timeout + refused))
end
"""


def load_wrk(port: int, concurrency: int, duration: float, body: Path, *, distinct: bool = False) -> dict[str, float]:
    """`concurrency` keep-alive connections from one wrk thread for `duration` seconds; `distinct`:
    each request's pod has a name of its own (`@N@` in the body)."""
    script = body.with_suffix(".lua")
    script.write_text(WRK_SCRIPT)
    seconds = max(1, round(duration))  # wrk takes whole seconds
    out = subprocess.run(["timeout", "-s", "KILL", str(seconds + 60), "wrk", "-t1", f"-c{concurrency}",
                          f"-d{seconds}s", "--timeout", "10s", "-s", str(script),
                          f"https://127.0.0.1:{port}{PATH}?timeout=10s"],
                         capture_output=True, text=True, env={**os.environ, "TFUSION_BENCH_BODY": str(body),
                                                              "TFUSION_BENCH_DISTINCT": "1" if distinct else "0"})
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return {"requests_per_s": round(found["requests"] / (found["duration_us"] / 1e6), 1),
            "p50_ms": found["p50_us"] / 1000, "p90_ms": found["p90_us"] / 1000, "p99_ms": found["p99_us"] / 1000,
            "errors": found["errors"], "mean_ms": round(found["mean_us"] / 1000, 3)}


def load(port: int, concurrency: int, duration: float, clients: int, ca_pem: str) -> dict[str, float]:
    clients = max(1, min(clients, concurrency))
    shares = [concurrency // clients + (1 if i < concurrency % clients else 0) for i in range(clients)]
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 1.5  # every process connected and waiting
    procs = [ctx.Process(target=_client, args=(port, share, duration, ca_pem, start_at, queue)) for share in shares]
    for proc in procs:
        proc.start()
    latencies: list[float] = []
    errors = 0
    for _ in procs:
        got, failed = queue.get(timeout=duration + 60)
        latencies.extend(got)
        errors += failed
    for proc in procs:
        proc.join()
    latencies.sort()
    if not latencies:  # not one answer in time (a loaded machine while the webhook warms up): an error
        return {"requests_per_s": 0.0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "errors": max(errors, 1),
                "mean_ms": 0.0}

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 3)

    return {"requests_per_s": round(len(latencies) / duration, 1), "p50_ms": pct(0.50), "p90_ms": pct(0.90),
            "p99_ms": pct(0.99), "errors": errors, "mean_ms": round(statistics.fmean(latencies) * 1000, 3)}


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs; errors are summed."""
    merged = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    merged["errors"] = sum(r["errors"] for r in runs)
    return merged


# --- main -------------------------------------------------------------------------------------------------


def start_processes(tmp: Path) -> tuple[list[subprocess.Popen[bytes]], Api, int]:
    api_port, webhook_port, controller_port, probe_port = free_ports(4)
    kubeconfig = tmp / "kubeconfig"
    log = open(tmp / "apiserver.log", "wb")  # noqa: SIM115  closed with the process
    apiserver = subprocess.Popen([sys.executable, "-m", "tfusion", "--role=apiserver", "--apiserver-listen",
                                  f"127.0.0.1:{api_port}", "--state", str(tmp / "state.db"),
                                  "--kubeconfig-out", str(kubeconfig)], stdout=log, stderr=subprocess.STDOUT)
    wait("the API server's kubeconfig", kubeconfig.exists)
    api = Api(kubeconfig)
    wait("the API server", lambda: api.http.get("/readyz").status_code == 200)
    seed(api)
    env = {**os.environ, "OPERATOR_NAMESPACE": OPS}
    log = open(tmp / "webhook.log", "wb")  # noqa: SIM115
    webhook = subprocess.Popen([sys.executable, "-m", "tfusion", "--role=controller", f"--kube={kubeconfig}",
                                "--webhook-listen", f"127.0.0.1:{webhook_port}", "--controller-listen",
                                f"127.0.0.1:{controller_port}", "--health-probe-bind-address",
                                f"127.0.0.1:{probe_port}", "--leader-elect=false", "--log-level=warn",
                                "--dynamic-config", str(tmp / "config.yaml")],
                               stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=on_server_cpus)
    wait("the webhook's certificate Secret",
         lambda: api.http.get(f"/api/v1/namespaces/{OPS}/secrets/tensor-fusion-webhook-certs").status_code == 200)
    return [apiserver, webhook], api, webhook_port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", default="10,100")
    parser.add_argument("--clients", type=int, default=2, help="load-generating processes (--load python)")
    parser.add_argument("--load", choices=("wrk", "python"), default="wrk" if shutil.which("wrk") else "python")
    parser.add_argument("--repeat", type=int, default=3, help="alternating webhook/echo runs per concurrency")
    args = parser.parse_args()
    os.sched_setaffinity(0, OTHER_CPUS)  # inherited by the API server, wrk and the clients
    with tempfile.TemporaryDirectory(prefix="tfusion-bench-webhook-") as directory:
        tmp = Path(directory)
        procs, api, webhook_port = start_processes(tmp)
        try:
            secret = api.get(f"/api/v1/namespaces/{OPS}/secrets/tensor-fusion-webhook-certs")["data"]
            ca_pem = base64.b64decode(secret["ca.crt"]).decode()
            cert_pem, key_pem = (base64.b64decode(secret[k]) for k in ("tls.crt", "tls.key"))
            echo_port = free_ports(1)[0]
            echo = multiprocessing.get_context("spawn").Process(target=serve_echo, args=(echo_port, cert_pem, key_pem))
            echo.start()
            wait("the webhook to answer", lambda: load(webhook_port, 1, 0.5, 1, ca_pem)["errors"] == 0)
            wait("the echo endpoint", lambda: load(echo_port, 1, 0.2, 1, ca_pem)["errors"] == 0)
            workload = f"/apis/tensor-fusion.ai/v1/namespaces/{NAMESPACE}/tensorfusionworkloads/bench-pod"
            version = api.version(workload)
            body, distinct_body, fresh_body = tmp / "review.json", tmp / "distinct.json", tmp / "fresh.json"
            body.write_bytes(review_body())
            distinct_body.write_bytes(review_body("bench-pod-@N@", dry_run=True))
            # a shape of its own too (an env value), so no memo entry answers it: a first pod
            fresh_body.write_bytes(review_body("bench-fresh-@N@", dry_run=True, epochs="@N@"))

            def run(port: int, concurrency: int) -> dict[str, float]:
                if args.load == "wrk":
                    return load_wrk(port, concurrency, args.duration, body)
                return load(port, concurrency, args.duration, args.clients, ca_pem)

            for concurrency in (int(c) for c in args.concurrency.split(",")):
                # alternating runs, medians reported: one run on a shared 2-core VM swings by a third
                pairs = [(run(webhook_port, concurrency), run(echo_port, concurrency)) for _ in range(args.repeat)]
                hook, bare = median_run([h for h, _ in pairs]), median_run([b for _, b in pairs])
                # the pod of these reviews is never created, so the controller deletes its workload
                # once the admission grace (60 s) has passed; the next review creates it again
                now_version = api.version(workload)
                named_runs: list[dict[str, float]] = []
                first_runs: list[dict[str, float]] = []
                if args.load == "wrk":  # pods never seen before (dryRun: no workload of their own)
                    for _ in range(args.repeat):
                        named_runs.append(load_wrk(webhook_port, concurrency, args.duration, distinct_body,
                                                   distinct=True))
                        first_runs.append(load_wrk(webhook_port, concurrency, args.duration, fresh_body,
                                                   distinct=True))
                named = median_run(named_runs) if named_runs else {}
                first = median_run(first_runs) if first_runs else {}
                print(json.dumps({
                    "concurrency": concurrency, "requests_per_s": hook["requests_per_s"], "p50_ms": hook["p50_ms"],
                    "p90_ms": hook["p90_ms"], "p99_ms": hook["p99_ms"],
                    "echo_requests_per_s": bare["requests_per_s"],
                    "ratio_to_echo": round(hook["requests_per_s"] / bare["requests_per_s"], 3),
                    "errors": hook["errors"] + bare["errors"], "echo_p99_ms": bare["p99_ms"],
                    "workload_writes": int(None not in (version, now_version) and now_version != version),
                    "workload_collected": now_version is None,
                    **({"distinct_pods_requests_per_s": named["requests_per_s"],
                        "distinct_pods_p99_ms": named["p99_ms"], "distinct_pods_errors": named["errors"],
                        "first_pods_requests_per_s": first["requests_per_s"],
                        "first_pods_p99_ms": first["p99_ms"], "first_pods_errors": first["errors"]}
                       if first else {}),
                    "runs": {"requests_per_s": [h["requests_per_s"] for h, _ in pairs],
                             "p99_ms": [h["p99_ms"] for h, _ in pairs],
                             "echo_requests_per_s": [b["requests_per_s"] for _, b in pairs],
                             **({"distinct_pods_requests_per_s": [n["requests_per_s"] for n in named_runs],
                                 "distinct_pods_p99_ms": [n["p99_ms"] for n in named_runs],
                                 "first_pods_requests_per_s": [f["requests_per_s"] for f in first_runs],
                                 "first_pods_p99_ms": [f["p99_ms"] for f in first_runs]} if first_runs else {})},
                    "cpus": os.cpu_count(), "pinned": PINNED,
                    "duration_s": args.duration, "load": args.load,
                    **({"clients": args.clients} if args.load == "python" else {})}), flush=True)
                version = api.version(workload)
            echo.terminate()
            echo.join()
        finally:
            for proc in reversed(procs):
                stop(proc)


if __name__ == "__main__":
    main()
