"""Embedded API server throughput and latency, over real HTTP, printed as ONE JSON object.

Starts `tfusion --role=apiserver` in a child process (its own core, a fresh state file), then drives it
from this process with many concurrent keep-alive connections (a minimal HTTP/1.1 client, so the
client's own cost does not hide the server's), over HTTPS with the kubeconfig's bearer token, as
every client of the server talks to it:

- creates_per_s: ConfigMap creates per second with `--clients` concurrent connections;
- patch_p99_ms: p99 latency of merge patches with `--clients` concurrent patchers;
- watch_lag_p99_ms: time from sending a patch to the matching event arriving at a watcher, measured
  while the concurrent patch load runs. The commit happens somewhere inside that window, so this is
  an upper bound on the true lag (it includes the request's own queueing under load);
- watch_lag_after_response_p99_ms: counted from the patch's response instead (0 when the event
  arrives first: the server sends the event and the response in the same step, once committed).

At scale (`--pods`, 100,000 by default; 0 skips it), in a second server process of its own:

- pods_create_per_s: TF worker pods (bound, annotated, owned; about 4.6 KB of JSON each) created
  with `--clients` concurrent connections; apiserver_cpu_ms_per_pod: the server process's CPU time
  for those creates, per pod (user + system: the figure to compare on a shared machine);
- list_100k_s: one client reading every pod as client-go's reflector does, pages of `limit=500`
  chained by `continue`, the client decoding only each page's list metadata (its token) and counting
  its items, so the time is the server's and the connection's; list_pages, list_items;
  list_server_cpu_s: the server process's CPU time for it (user + system, from /proc: a figure a
  busy machine does not inflate); list_100k_decoded_s: the same list again with the client decoding
  every page whole, as a reflector does (this Python client's decoding included);
- server_rss_mb: the server's resident memory after the creates and the list; server_rss_kb_per_pod:
  its growth from before the creates, per pod; store_disk_mb: the state file and its WAL;
- watch_fanout_lag_p50_ms / watch_fanout_lag_p99_ms: `--watchers` watchers of all pods while one
  writer merge-patches pods at `--patch-rate` per second for `--fanout-seconds`; lag is the time a
  watcher reads the event minus the time the writer read the patch's response (0 when the event
  came first), over every (watcher, event) pair; watch_fanout_lag_from_request_p99_ms counts from
  sending the patch instead (an upper bound); fanout_patches_per_s is the rate the writer reached
  (it writes one patch at a time, so a slow answer lowers it); watch_fanout_events_missing counts
  pairs never seen (any makes the benchmark fail).

Usage: python benchmarks/apiserver.py [--clients 32] [--creates 6000] [--seconds 3]
           [--pods 100000] [--watchers 10] [--patch-rate 200] [--fanout-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import yaml
from _processes import stop

NS_PATH = "/api/v1/namespaces/default/configmaps"
PODS_NS_PATH = "/api/v1/namespaces/default/pods"
ALL_PODS_PATH = "/api/v1/pods"
LIST_PAGE = 500


class Server:
    """Where the server is and how to talk to it (from the kubeconfig it wrote)."""

    def __init__(self, host: str, port: int, token: str, tls: ssl.SSLContext) -> None:
        self.host, self.port, self.token, self.tls = host, port, token, tls


class Connection:
    """One keep-alive HTTP/1.1 connection over TLS; requests are sequential on it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.host = server.host
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.server.host, self.server.port,
                                                                 ssl=self.server.tls)
        return self

    async def request(
        self, method: str, path: str, body: bytes = b"", content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: {content_type}\r\n"
            f"Authorization: Bearer {self.server.token}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def tf_worker_pod(i: int, namespace: str = "default") -> dict[str, Any]:
    """A TF worker pod as the controller leaves it: bound, running, annotated, owned; about 4 KB."""
    name = f"tf-worker-{i:06d}"
    workload = f"train-{i // 8:05d}"
    node = f"gpu-node-{i % 5000:04d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app": workload,
                "tensor-fusion.ai/enabled": "true",
                "tensor-fusion.ai/gpupool": "pool-a",
                "tensor-fusion.ai/workload": workload,
                "tensor-fusion.ai/component": "worker",
                "pod-template-hash": "5d8f7c9b6d",
            },
            "annotations": {
                "tensor-fusion.ai/gpupool": "pool-a",
                "tensor-fusion.ai/tflops-request": "20",
                "tensor-fusion.ai/tflops-limit": "40",
                "tensor-fusion.ai/vram-request": "8Gi",
                "tensor-fusion.ai/vram-limit": "16Gi",
                "tensor-fusion.ai/gpu-count": "1",
                "tensor-fusion.ai/gpu-ids": f"gpu-{node}-{i % 4}",
                "tensor-fusion.ai/qos": "medium",
                "tensor-fusion.ai/workload-profile": "default-profile",
                "tensor-fusion.ai/isolation": "soft",
                "kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z",
            },
            "ownerReferences": [{
                "apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionWorkload", "name": workload,
                "uid": f"00000000-0000-4000-8000-{i // 8:012d}", "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "tensor-fusion-scheduler",
            "serviceAccountName": "default",
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "worker",
                "image": "registry.example.com/tensorfusion/worker:1.42.0",
                "imagePullPolicy": "IfNotPresent",
                "command": ["/usr/local/bin/tensor-fusion-worker"],
                "args": ["--port=8000", "--metrics-port=9090", "--log-level=info"],
                "ports": [{"name": "worker", "containerPort": 8000, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                "env": [
                    {"name": "TENSOR_FUSION_WORKER_NAME", "value": name},
                    {"name": "TENSOR_FUSION_POOL", "value": "pool-a"},
                    {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                    *(
                        {"name": env, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}
                        for env, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                                          ("NODE_NAME", "spec.nodeName"))
                    ),
                ],
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
                "volumeMounts": [
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "tf-lib", "mountPath": "/tensor-fusion", "readOnly": True},
                    {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                     "readOnly": True},
                ],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8000}, "periodSeconds": 10},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            }],
            "volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "tf-lib", "hostPath": {"path": "/var/lib/tensor-fusion", "type": "DirectoryOrCreate"}},
                {"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ]}},
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "tensor-fusion.ai/gpupool", "operator": "In", "values": ["pool-a"]}]}
            ]}}},
        },
        "status": {
            "phase": "Running",
            "hostIP": f"10.1.{(i % 5000) // 250}.{(i % 250) + 1}",
            "podIP": f"10.244.{(i // 250) % 250}.{(i % 250) + 1}",
            "startTime": "2026-12-01T08:00:00Z",
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": "2026-12-01T08:00:05Z"}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [{
                "name": "worker", "ready": True, "started": True, "restartCount": 0,
                "image": "registry.example.com/tensorfusion/worker:1.42.0",
                "imageID": "registry.example.com/tensorfusion/worker@sha256:" + "ab" * 32,
                "containerID": f"containerd://{i:064x}",
                "state": {"running": {"startedAt": "2026-12-01T08:00:03Z"}},
            }],
        },
    }


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], Server]:
    kubeconfig = workdir / "kubeconfig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfusion",
            "--role=apiserver",
            "--apiserver-listen",
            "127.0.0.1:0",
            "--state",
            str(workdir / "state.db"),
            "--kubeconfig-out",
            str(kubeconfig),
            "--log-level",
            "warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"apiserver did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.05)
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    host, port = cluster["server"].split("//")[1].rsplit(":", 1)
    tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return proc, Server(host, int(port), config["users"][0]["user"]["token"], tls)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


async def creates_per_s(server: Server, clients: int, total: int, path: str,
                        body_of: Callable[[int], bytes]) -> float:
    """POST `body_of(i)` for i < `total` to `path` from `clients` keep-alive connections; creates/s."""
    connections = [await Connection(server).open() for _ in range(clients)]
    counter = iter(range(total))

    async def worker(conn: Connection) -> None:
        for i in counter:
            status, answer = await conn.request("POST", path, body_of(i))
            assert status == 201, (status, answer[:300])

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    elapsed = time.perf_counter() - started
    for conn in connections:
        conn.close()
    return total / elapsed


def config_map(i: int) -> bytes:
    return json.dumps({"metadata": {"name": f"cm-{i}", "labels": {"bench": "yes"}}, "data": {"k": "v" * 64}}).encode()


async def patches_with_watch(server: Server, clients: int, objects: int, seconds: float) -> dict[str, Any]:
    host = server.host
    arrivals: dict[str, float] = {}
    ready = asyncio.Event()

    async def watcher() -> None:
        reader, writer = await asyncio.open_connection(host, server.port, ssl=server.tls)
        status_rv = await list_rv()
        writer.write(f"GET {NS_PATH}?watch=true&resourceVersion={status_rv} HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: Bearer {server.token}\r\n\r\n".encode())
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        ready.set()
        buffer = b""
        try:
            while True:
                size_line = await reader.readline()
                size = int(size_line.strip() or b"0", 16)
                chunk = await reader.readexactly(size + 2)
                now = time.perf_counter()
                buffer += chunk[:-2]
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line:
                        event = json.loads(line)
                        arrivals[event["object"]["metadata"]["resourceVersion"]] = now
        finally:
            writer.close()

    async def list_rv() -> str:
        conn = await Connection(server).open()
        _, body = await conn.request("GET", f"{NS_PATH}?limit=1")
        conn.close()
        return str(json.loads(body)["metadata"]["resourceVersion"])

    watch_task = asyncio.ensure_future(watcher())
    await ready.wait()
    latencies: list[float] = []
    responded: dict[str, float] = {}
    requested: dict[str, float] = {}
    deadline = time.perf_counter() + seconds
    connections = [await Connection(server).open() for _ in range(clients)]

    async def patcher(index: int, conn: Connection) -> None:
        n = 0
        while time.perf_counter() < deadline:
            name = f"cm-{(index + n * clients) % objects}"
            n += 1
            body = json.dumps({"data": {"k": f"{index}-{n}"}}).encode()
            started = time.perf_counter()
            status, answer = await conn.request("PATCH", f"{NS_PATH}/{name}", body, "application/merge-patch+json")
            done = time.perf_counter()
            assert status == 200, (status, answer[:200])
            latencies.append(done - started)
            rv = json.loads(answer)["metadata"]["resourceVersion"]
            responded[rv] = done
            requested[rv] = started

    await asyncio.gather(*(patcher(i, c) for i, c in enumerate(connections)))
    await asyncio.sleep(0.5)  # let the last events arrive
    watch_task.cancel()
    for conn in connections:
        conn.close()
    lags = [arrivals[rv] - t for rv, t in requested.items() if rv in arrivals]
    # an event that arrives before the writer has read its response counts as zero here
    after_response = [max(0.0, arrivals[rv] - t) for rv, t in responded.items() if rv in arrivals]
    missing = len(responded) - len(lags)
    return {
        "patches_per_s": round(len(latencies) / seconds, 1),
        "patch_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "patch_p99_ms": round(p99(latencies) * 1000, 2),
        "watch_lag_p50_ms": round(statistics.median(lags) * 1000, 2) if lags else None,
        "watch_lag_p99_ms": round(p99(lags) * 1000, 2) if lags else None,
        "watch_lag_after_response_p99_ms": round(p99(after_response) * 1000, 2) if after_response else None,
        "watch_events_missing": missing,
    }


async def paged_list(server: Server, *, decode: bool) -> tuple[float, int, int, str]:
    """Every pod, as a reflector lists: pages of LIST_PAGE chained by `continue`, one connection.

    With `decode`, the client decodes each page whole, as a reflector does; without, it decodes only
    the list's metadata (which comes before the items) and counts the items, so the time is the
    server's and the connection's, not this Python client's."""
    conn = await Connection(server).open()
    token, pages, items, rv = "", 0, 0, ""
    # the client's cyclic GC would walk every object of the pages decoded so far: a cost of the
    # Python client, not of the server (client-go's decoder has none); decoded pages hold no cycles
    gc.disable()
    started = time.perf_counter()
    while True:
        query = f"?limit={LIST_PAGE}" + (f"&continue={token}" if token else "")
        status, body = await conn.request("GET", ALL_PODS_PATH + query)
        assert status == 200, (status, body[:300])
        if decode:
            page = orjson.loads(body)
            meta, count = page["metadata"], len(page["items"])
        else:
            head = body[: body.index(b',"items":[')] + b"}"
            meta, count = orjson.loads(head)["metadata"], body.count(b'"kind":"Pod"')
        pages += 1
        items += count
        rv = rv or meta["resourceVersion"]
        token = meta.get("continue", "")
        if not token:
            break
    elapsed = time.perf_counter() - started
    gc.enable()
    conn.close()
    return elapsed, pages, items, rv


async def watch_fanout(server: Server, watchers: int, pods: int, rate: float, seconds: float,
                       rv: str) -> dict[str, Any]:
    """`watchers` watches of all pods; one writer patches pods at `rate` per second."""
    arrivals: list[dict[str, float]] = [{} for _ in range(watchers)]
    ready = [asyncio.Event() for _ in range(watchers)]

    async def watcher(index: int) -> None:
        reader, writer = await asyncio.open_connection(server.host, server.port, ssl=server.tls)
        # as client-go's reflector watches: bookmarks allowed, a timeout asked for
        query = f"watch=true&allowWatchBookmarks=true&timeoutSeconds=3600&resourceVersion={rv}"
        writer.write(f"GET {ALL_PODS_PATH}?{query} HTTP/1.1\r\nHost: {server.host}\r\n"
                     f"Authorization: Bearer {server.token}\r\n\r\n".encode())
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        ready[index].set()
        seen = arrivals[index]
        buffer = b""
        try:
            while True:
                size = int((await reader.readline()).strip() or b"0", 16)
                chunk = await reader.readexactly(size + 2)
                now = time.perf_counter()
                buffer += chunk[:-2]
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = orjson.loads(line) if line else None
                    if event and event["type"] != "BOOKMARK":
                        seen[event["object"]["metadata"]["resourceVersion"]] = now
        finally:
            writer.close()

    tasks = [asyncio.ensure_future(watcher(i)) for i in range(watchers)]
    for event in ready:
        await event.wait()
    conn = await Connection(server).open()
    responded: dict[str, float] = {}
    requested: dict[str, float] = {}
    interval = 1.0 / rate
    started = time.perf_counter()
    n = 0
    while (now := time.perf_counter()) < started + seconds:
        next_at = started + n * interval
        if now < next_at:
            await asyncio.sleep(next_at - now)
        body = orjson.dumps({"metadata": {"annotations": {"bench/tick": str(n)}}})
        sent = time.perf_counter()
        status, answer = await conn.request("PATCH", f"{PODS_NS_PATH}/{tf_worker_pod_name(n * 7919 % pods)}",
                                            body, "application/merge-patch+json")
        assert status == 200, (status, answer[:300])
        rv_ = orjson.loads(answer)["metadata"]["resourceVersion"]
        responded[rv_] = time.perf_counter()
        requested[rv_] = sent
        n += 1
    elapsed = time.perf_counter() - started
    deadline = time.perf_counter() + 10
    while time.perf_counter() < deadline and any(len(seen) < len(responded) for seen in arrivals):
        await asyncio.sleep(0.05)  # the last events still on their way
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    conn.close()
    lags = [max(0.0, seen[rv_] - t) for seen in arrivals for rv_, t in responded.items() if rv_ in seen]
    from_request = [seen[rv_] - t for seen in arrivals for rv_, t in requested.items() if rv_ in seen]
    return {
        "watchers": watchers,
        "patch_rate_per_s": rate,
        "fanout_patches": len(responded),
        "fanout_patches_per_s": round(len(responded) / elapsed, 1),
        "watch_fanout_lag_p50_ms": round(statistics.median(lags) * 1000, 2) if lags else None,
        "watch_fanout_lag_p99_ms": round(p99(lags) * 1000, 2) if lags else None,
        # counted from sending the patch instead: an upper bound that includes the patch's own latency
        "watch_fanout_lag_from_request_p99_ms": round(p99(from_request) * 1000, 2) if from_request else None,
        "watch_fanout_events_missing": len(responded) * watchers - len(lags),
    }


def tf_worker_pod_name(i: int) -> str:
    return f"tf-worker-{i:06d}"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (its own, not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def disk_mb(state: Path) -> float:
    files = [state, state.with_name(state.name + "-wal")]
    return round(sum(f.stat().st_size for f in files if f.exists()) / 2**20, 1)


async def at_scale(args: argparse.Namespace, server: Server, pid: int, state: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"pods": args.pods}
    idle_rss = rss_mb(pid)
    server_cpu = cpu_s(pid)
    result["pods_create_per_s"] = round(await creates_per_s(server, args.clients, args.pods, PODS_NS_PATH,
                                                                  lambda i: orjson.dumps(tf_worker_pod(i))), 1)
    result["apiserver_cpu_ms_per_pod"] = round((cpu_s(pid) - server_cpu) * 1000 / args.pods, 3)
    server_cpu = cpu_s(pid)
    elapsed, pages, items, rv = await paged_list(server, decode=False)
    result.update(list_100k_s=round(elapsed, 2), list_pages=pages, list_items=items,
                  list_server_cpu_s=round(cpu_s(pid) - server_cpu, 2))
    decoded_s, _, decoded_items, _ = await paged_list(server, decode=True)
    result["list_100k_decoded_s"] = round(decoded_s, 2)
    if items != args.pods or decoded_items != args.pods:
        raise SystemExit(f"the paged lists returned {items} and {decoded_items} pods, not {args.pods}")
    result["server_rss_mb"] = rss_mb(pid)
    result["server_rss_kb_per_pod"] = round((result["server_rss_mb"] - idle_rss) * 1024 / args.pods, 2)
    result["store_disk_mb"] = disk_mb(state)
    server_cpu = cpu_s(pid)
    fanout = await watch_fanout(server, args.watchers, args.pods, args.patch_rate, args.fanout_seconds, rv)
    fanout["fanout_server_cpu_ms_per_patch"] = round(
        (cpu_s(pid) - server_cpu) * 1000 / max(fanout["fanout_patches"], 1), 2
    )
    if fanout["watch_fanout_events_missing"]:
        raise SystemExit(f"watchers missed events: {fanout}")
    result.update(fanout)
    return result


async def main_async(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    result: dict[str, Any] = {"clients": args.clients, "creates": args.creates}
    result["creates_per_s"] = round(await creates_per_s(server, args.clients, args.creates, NS_PATH, config_map), 1)
    result.update(await patches_with_watch(server, args.clients, args.creates, args.seconds))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--creates", type=int, default=6000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pods", type=int, default=100_000, help="pods for the list and fan-out; 0: skip")
    parser.add_argument("--watchers", type=int, default=10)
    parser.add_argument("--patch-rate", type=float, default=200.0)
    parser.add_argument("--fanout-seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, server = start_server(Path(tmp))
        try:
            result = asyncio.run(main_async(args, server))
        finally:
            stop(proc)
    if args.pods:
        # a server of its own, so that the configmaps and patches above do not share its store
        with tempfile.TemporaryDirectory() as tmp:
            proc, server = start_server(Path(tmp))
            try:
                result["at_scale"] = asyncio.run(at_scale(args, server, proc.pid, Path(tmp) / "state.db"))
            finally:
                stop(proc)
    result["cpu_count"] = os.cpu_count()
    result["note"] = "server in its own process, client in this one, same machine, HTTPS with a bearer token"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
