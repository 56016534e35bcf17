"""GET /api/connection long-poll: many clients waiting at once, then all their workers turn Running (issue 15).

Processes: the embedded API server (`tfusion --role=apiserver`); the controller in its own process
(`tfusion --role=controller`, webhook and scheduler off) as a *follower*: the benchmark holds the
leader Lease, so no reconciler touches the connections and the route is measured on its own (it
answers on every replica); and the clients in a third process. The benchmark creates `--waiters`
plain pods, one TensorFusionConnection owned by each (status Pending) and one token bound to each
pod; every client holds one HTTP/1.1 connection and asks `GET /api/connection` for its own
connection with its own pod's token (a real TokenReview each, then the wait). Once the controller's
`tfusion_connection_waiters` gauge shows them all waiting, the benchmark writes each connection's
status Running with its URL (8 PATCHes at a time) and records when each PATCH was sent; a
client's latency is from that moment to the moment its answer arrived (an upper bound: it includes
the API server's handling of the PATCH).

    .venv/bin/python benchmarks/connection.py [--waiters 1000]

Prints one JSON object: waiters, answered (200 with the right URL), answer_after_ready_p50_ms,
answer_after_ready_p99_ms, rss_mb_per_1000_waiters (the controller's resident memory with every
client waiting, less before they came, per 1,000), and errors, max_ms, setup_s, cpus. Targets
(issue 15): all answered, p99 <= 200 ms, <= 50 MB per 1,000 waiters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _processes import free_ports, stop
from webhook import Api, wait  # the sibling benchmark's helpers

OPS = "tensor-fusion-sys"
NS = "default"
LEASE = "85104305.tensor-fusion.ai"
TF = "/apis/tensor-fusion.ai/v1"
CONCURRENCY = 32


def seed(api: Api) -> None:
    from tfusion.api.crds import all_crds
    from tfusion.api.timestamps import micro_time

    for crd in all_crds():
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    wait("the CRDs served", lambda: api.get(f"{TF}/tensorfusionconnections") is not None)
    api.create("/api/v1/namespaces", {"metadata": {"name": OPS}})
    # the benchmark leads: the controller stays a follower and runs no reconciler
    api.create(f"/apis/coordination.k8s.io/v1/namespaces/{OPS}/leases", {"metadata": {"name": LEASE}, "spec": {
        "holderIdentity": "benchmark", "leaseDurationSeconds": 3600, "renewTime": micro_time(),
        "acquireTime": micro_time()}})


async def make_clients(kubeconfig: Path, count: int) -> dict[str, str]:
    """`count` pods, a Pending connection owned by each, a token bound to each: name -> token."""
    from tfusion.kube import resources as r
    from tfusion.kube.client import KubeClient

    client = await KubeClient.connect(str(kubeconfig), qps=0)
    tokens: dict[str, str] = {}
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        name = f"client-{i:05d}"
        async with limit:
            pod = await client.create(r.PODS, {"metadata": {"name": name, "namespace": NS}, "spec": {
                "serviceAccountName": "default", "containers": [{"name": "app", "image": "app"}]}}, namespace=NS)
            uid = pod["metadata"]["uid"]
            await client.create(r.TENSORFUSIONCONNECTIONS, {"metadata": {"name": name, "namespace": NS,
                                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]},
                                "spec": {"workloadName": "bench", "clientPod": name}}, namespace=NS)
            await client.patch(r.TENSORFUSIONCONNECTIONS, name, {"status": {
                "phase": "Pending", "workerName": "", "connectionURL": ""}}, namespace=NS, subresource="status")
            tokens[name] = await client.request_token(NS, "default", bound_pod={"name": name, "uid": uid})

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()
    return tokens


def url_for(name: str) -> str:
    return f"native+10.1.{int(name[-5:]) // 250}.{int(name[-5:]) % 250 + 1}+8000+worker-{name}-1"


# --- the clients (their own process) --------------------------------------------------------------------


async def _ask(port: int, name: str, token: str, answers: dict[str, tuple[int, str, float]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write((f"GET /api/connection?name={name}&namespace={NS} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {token}\r\n\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        arrived = time.time()
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        body = (await reader.readexactly(length)).decode()
        answers[name] = (int(head.split(b" ")[1]), body, arrived)
    finally:
        writer.close()


def clients(port: int, tokens: dict[str, str], queue: Any) -> None:
    answers: dict[str, tuple[int, str, float]] = {}

    async def main() -> None:
        results = await asyncio.gather(*(_ask(port, name, token, answers) for name, token in tokens.items()),
                                       return_exceptions=True)
        errors = [repr(e) for e in results if isinstance(e, BaseException)]
        queue.put((answers, errors[:5], len(errors)))

    asyncio.run(main())


# --- measuring ------------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def waiters(controller: httpx.Client) -> float:
    for line in controller.get("/metrics").text.splitlines():
        if line.startswith("tfusion_connection_waiters "):
            return float(line.split()[1])
    return -1.0


async def turn_running(kubeconfig: Path, names: list[str]) -> dict[str, float]:
    """Each connection Running with its URL; name -> when its PATCH was sent."""
    from tfusion.kube import resources as r
    from tfusion.kube.client import KubeClient

    client = await KubeClient.connect(str(kubeconfig), qps=0)
    sent: dict[str, float] = {}
    limit = asyncio.Semaphore(8)

    async def one(name: str) -> None:
        async with limit:
            sent[name] = time.time()
            await client.patch(r.TENSORFUSIONCONNECTIONS, name, {"status": {
                "phase": "Running", "workerName": f"worker-{name}", "connectionURL": url_for(name)}},
                namespace=NS, subresource="status")

    try:
        await asyncio.gather(*(one(name) for name in names))
    finally:
        await client.close()
    return sent


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 2) if ordered else 0.0


def run(tmp: Path, count: int) -> dict[str, Any]:
    api_port, controller_port, probe_port = free_ports(3)
    kubeconfig = tmp / "kubeconfig"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log = open(tmp / "apiserver.log", "wb")  # noqa: SIM115  closed with the process
        procs.append(subprocess.Popen([sys.executable, "-m", "tfusion", "--role=apiserver", "--apiserver-listen",
                                       f"127.0.0.1:{api_port}", "--state", str(tmp / "state.db"),
                                       "--kubeconfig-out", str(kubeconfig)], stdout=log, stderr=subprocess.STDOUT))
        wait("the API server's kubeconfig", kubeconfig.exists)
        api = Api(kubeconfig)
        wait("the API server", lambda: api.http.get("/readyz").status_code == 200)
        seed(api)
        began = time.monotonic()
        tokens = asyncio.run(make_clients(kubeconfig, count))
        setup_s = time.monotonic() - began
        env = {**os.environ, "OPERATOR_NAMESPACE": OPS, "ENABLE_WEBHOOKS": "false", "ENABLE_SCHEDULER": "false"}
        log = open(tmp / "controller.log", "wb")  # noqa: SIM115
        controller_proc = subprocess.Popen([
            sys.executable, "-m", "tfusion", "--role=controller", f"--kube={kubeconfig}", "--controller-listen",
            f"127.0.0.1:{controller_port}", "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
            "--log-level=warn", "--connection-wait=120s", "--dynamic-config", str(tmp / "config.yaml")],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append(controller_proc)
        controller = httpx.Client(base_url=f"http://127.0.0.1:{controller_port}", timeout=30)
        wait("the controller ready", lambda: controller.get("/readyz").status_code == 200)
        # warm the route (and the code paths of a 200) before the baseline
        warm = next(iter(tokens))
        probe = {"Authorization": f"Bearer {tokens[warm]}"}
        wait("the route", lambda: controller.get("/api/connection", params={"name": "x", "namespace": NS},
                                                 headers=probe).status_code == 404)
        baseline = rss_mb(controller_proc.pid)
        queue = multiprocessing.get_context("spawn").Queue()
        load = multiprocessing.get_context("spawn").Process(target=clients, args=(controller_port, tokens, queue))
        load.start()
        wait(f"{count} requests waiting", lambda: waiters(controller) >= count, timeout=300)
        time.sleep(0.5)  # let the last requests' allocations settle
        waiting_rss = rss_mb(controller_proc.pid)
        sent = asyncio.run(turn_running(kubeconfig, list(tokens)))
        answers, first_errors, error_count = queue.get(timeout=300)
        load.join()
        latencies = [(answers[n][2] - sent[n]) * 1000 for n in answers if n in sent]
        right = sum(1 for n, (code, body, _) in answers.items() if code == 200 and body == url_for(n))
        return {"waiters": count, "answered": right, "answer_after_ready_p50_ms": percentile(latencies, 0.50),
                "answer_after_ready_p99_ms": percentile(latencies, 0.99),
                "rss_mb_per_1000_waiters": round((waiting_rss - baseline) * 1000 / count, 2),
                "max_ms": round(max(latencies, default=0.0), 2), "errors": error_count + (len(answers) - right),
                "first_errors": first_errors, "controller_rss_mb_before": round(baseline, 1),
                "controller_rss_mb_waiting": round(waiting_rss, 1), "setup_s": round(setup_s, 1),
                "cpus": os.cpu_count()}
    finally:
        for proc in reversed(procs):
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--waiters", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfusion-bench-connection-") as directory:
        print(json.dumps(run(Path(directory), args.waiters)), flush=True)


if __name__ == "__main__":
    main()
