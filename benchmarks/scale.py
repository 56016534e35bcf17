"""The controller at cluster scale, printed as ONE JSON object: memory, time to lead, failover, and
scheduling throughput on a large cluster.

`tfusion --role=apiserver` runs in its own process; this one builds the cluster through it over
many keep-alive connections (`scheduling.py`'s raw client): `--nodes` Ready Nodes in pools of
1,000, `--gpus` GPUs with their status reported, and `--pods` running TF worker pods, already
bound, in `--namespaces` namespaces, each namespace with a GPUResourceQuota, every
`--pods-per-workload` of them one Deployment (a Deployment, its ReplicaSet and the
TensorFusionWorkload). The bound pods are clones of one pod that tfusion itself admitted and
bound: a controller is started on the cluster before the pods exist, a Deployment-owned pod goes
through its webhook and scheduler, and every bound pod is that pod with its names, node and GPU
changed (so its annotations are exactly what the allocator recovers from).

Then `tfusion --role=controller` replicas are started with leader election (client-go's default
Lease timings 15 s / 10 s / 2 s, which are tfusion's defaults) and measured:
- `ready_s`: process start -> /readyz 200 with the `allocator` condition "leader: recovered …"
  (every informer synced, the Lease held, the allocator rebuilt from the cache; the first bind is
  possible from then on — the scheduler and webhook wait for exactly that allocator);
- `ready_cpu_s`: the CPU seconds (user + system) the replica used up to then, which a busy
  machine does not inflate (start-up imports included), less what answering this script's
  /readyz polls cost it (polls x the CPU of one poll, measured on the ready replica);
- `rss_mb`: the leader's VmRSS once recovered; `rss_kb_per_pod` = (RSS at full size - RSS of a
  controller on the cluster with its nodes and GPUs but no pods) / pods, and `rss_kb_per_gpu` =
  (RSS with the nodes and GPUs - RSS on the empty cluster) / GPUs (nodes and pools included):
  the marginal cost, each measured 3 s after recovery (no collection is forced: RSS is what the
  process holds, garbage included);
- `allocator_mb` (once, outside the runs): a controller run in a separate process of this script
  on the full cluster, whose allocator's object graph is walked with `sys.getsizeof` once it has
  recovered (strings and numbers it shares with the informer caches counted too), and
  `cache_kb_per_pod` from the same walk of the pod informer's store;
- the hand-overs, in this order, each run: two standbys sync while the first leader is measured;
  `failover_release_s`: SIGTERM of the leader, which releases its Lease -> one of the standbys
  has recovered (tfusion's fast hand-over: one retry period); `failover_kill_s`: `kill -9` of that
  leader -> the other standby (already synced) has recovered (bounded below by the 15 s lease
  duration); `failover_restart_s`: `kill -9` of that one and the same replica (same identity, as
  a pod restarted under its name) started again -> it has recovered (it takes its own Lease back
  without waiting for it to expire);
- `settle_s`: the restarted leader's recovery -> its work queues are empty (`tfusion_workqueue_depth`
  0 on every controller) and its metrics recorder has made the term's first tick
  (`tfusion_pool_workers` has samples): the term-start pass over every object (each pod, GPU and
  workload reconciled once, each worker's billing row made), during which it schedules too, more
  slowly;
- then, on that settled leader, `--new-pods` pods of Deployments (`--pods-per-workload` each, one
  Deployment's after another) created as the ReplicaSet controller sends a user's template (with
  its generateName: the API server names them), mutated by the controller's webhook and bound by
  its scheduler: `pods_per_s`, `bind_p50_ms`,
  `bind_p99_ms`, `unscheduled` and `double_allocations` (scheduling.py's definitions and checker,
  over every pod of the cluster), and `watch_relists`: how often the benchmark's bind watcher fell
  behind the API server's watch history and listed instead (its pods then count as bound when the
  list saw them).

`phases_s` gives the command's own wall-clock time by phase (the build's parts, each run's
failovers and new pods, the final check, the allocator walk) and `total_s` all of it.

Then, when `--compare-nodes` (1,000 by default) is fewer than `--nodes`, the command runs itself
again in a child process at that many nodes: the same GPUs per node, the same new pods (as many,
in Deployments of the same size, the same runs and clients), the bound pods scaled down with the
nodes as far as the runs leave room; `compared` holds its figures and `pods_per_s_ratio` is the
full size's median `pods_per_s` over its median: what is left of the throughput when only the
cluster's size changes (issue 33: at least 0.8). `command_s` is the whole command's time.

Each figure is the median of `--runs` runs on the one cluster (each run starts fresh replicas and
schedules its own `--new-pods`), with the runs' min and max beside it. Exits 1 on any double
allocation or unscheduled pod, and fails when a new pod is not seen bound.

Usage: python benchmarks/scale.py [--nodes 5000] [--gpus 20000] [--pods 100000] [--new-pods 10000] [--runs 3]
                                  [--compare-nodes 1000]
Quick: python benchmarks/scale.py --nodes 500 --gpus 2000 --pods 10000 --new-pods 1000 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import scheduling as sched
from _processes import stop
from prometheus_client.parser import text_string_to_metric_families

from tfusion.api import annotations as tfa
from tfusion.api.crds import all_crds
from tfusion.api.documents import collector_paused
from tfusion.api.podindex import encode_pod_index
from tfusion.controller.webhook.registration import MUTATING_WEBHOOK_CONFIGURATIONS
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, NotFound

GPU_TFLOPS, GPU_VRAM = 100, 80  # TFLOPS, Gi
POD_TFLOPS, POD_VRAM = 10, 8
NODES_PER_POOL = 1000
TEMPLATE_POOL = "pool-0"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used: unlike wall-clock time, not inflated by
    other processes on a busy machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spread(values: list[float], digits: int = 2) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


class Cluster:
    """The API server process, its raw connections, and the names of what was created."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.kubeconfig = work / "kubeconfig"
        self.apiserver: subprocess.Popen[bytes] | None = None
        self.server: Any = None
        self.kube: KubeClient | None = None
        self.namespaces = [f"team-{i:02d}" for i in range(args.namespaces)]
        self.pools = [f"pool-{i}" for i in range(max(1, -(-args.nodes // NODES_PER_POOL)))]
        self.controllers: list[subprocess.Popen[bytes]] = []
        self.new_deployments = 0
        #: the command's wall-clock seconds by phase, in order (the JSON's `phases_s`)
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times a phase; its start and end go to stderr, the progress of a command that runs for minutes."""
        started = time.monotonic()
        print(f"scale.py: {name} ...", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - started, 1)
            print(f"scale.py: {name} {self.phases[name]} s", file=sys.stderr, flush=True)

    def node(self, i: int) -> str:
        return f"node-{i:05d}"

    def gpu_node(self, g: int) -> int:
        return g % self.args.nodes

    def pool_of_node(self, n: int) -> str:
        return self.pools[n // NODES_PER_POOL]

    # --- processes ------------------------------------------------------------------------------

    def start_apiserver(self) -> None:
        self.apiserver = sched.start(["--role=apiserver", "--apiserver-listen", f"127.0.0.1:{sched.free_port()}",
                                      "--state", str(self.work / "state.db"), "--kubeconfig-out",
                                      str(self.kubeconfig), "--watch-history", "200000"],
                                     self.work / "apiserver.log")
        sched.wait_for(self.kubeconfig, self.apiserver, "the API server")
        self.server = sched.raw_server(self.kubeconfig)

    def start_controller(self, identity: str, *, webhook_port: int | None = None) -> tuple[
            subprocess.Popen[bytes], str, float]:
        """A controller replica with leader election; its HTTP URL and when it was started."""
        port = sched.free_port()
        webhook = webhook_port or sched.free_port()
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tfusion", "--role=controller", "--kube", str(self.kubeconfig),
             "--leader-elect=true", "--controller-listen", f"127.0.0.1:{port}",
             "--health-probe-bind-address", f"127.0.0.1:{sched.free_port()}",
             "--webhook-listen", f"127.0.0.1:{webhook}", "--dynamic-config", str(self.work / "config.yaml"),
             "--log-level", self.args.controller_log_level],
            stdout=subprocess.DEVNULL, stderr=(self.work / f"controller-{identity}.log").open("ab"),
            env={**os.environ, "POD_NAME": identity, "POD_NAMESPACE": "tensor-fusion-sys"})
        self.controllers.append(proc)
        return proc, f"http://127.0.0.1:{port}", started

    def stop_all(self) -> None:
        for proc in [*self.controllers, self.apiserver]:
            if proc is not None and proc.poll() is None:
                stop(proc)

    # --- building -------------------------------------------------------------------------------

    async def connections(self) -> list[Any]:
        return [await sched.apibench.Connection(self.server).open() for _ in range(self.args.clients)]

    async def each(self, count: int, make: Callable[[int], list[tuple[str, str, Any]]]) -> list[list[bytes]]:
        """For i in range(count), the requests make(i) (method, path, body) in order on one
        connection; many i in parallel. Answers' bodies by i."""
        conns = await self.connections()
        numbers = iter(range(count))
        answers: list[list[bytes]] = [[] for _ in range(count)]

        async def worker(conn: Any) -> None:
            for i in numbers:
                for method, path, body in make(i):
                    kind = "application/merge-patch+json" if method == "PATCH" else "application/json"
                    status, answer = await conn.request(method, path, json.dumps(body).encode(), kind)
                    if status >= 300:
                        raise RuntimeError(f"{method} {path} answered {status}: {answer[:300]!r}")
                    answers[i].append(answer)

        try:
            await asyncio.gather(*(worker(c) for c in conns))
        finally:
            for conn in conns:
                conn.close()
        return answers

    async def create_base(self) -> None:
        self.kube = await KubeClient.connect(str(self.kubeconfig), namespace="default", qps=1e9, burst=10**9)
        kube = self.kube
        for crd in all_crds():
            await kube.create(r.CUSTOMRESOURCEDEFINITIONS, crd)
        for _ in range(200):
            with contextlib.suppress(Exception):
                await kube.list(r.GPURESOURCEQUOTAS)
                break
            await asyncio.sleep(0.05)
        for ns in (*self.namespaces, "tensor-fusion-sys"):
            with contextlib.suppress(AlreadyExists):  # the server makes its system namespaces
                await kube.create(r.NAMESPACES, {"metadata": {"name": ns}})
        classes = r.ApiResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
        for qos, value in (("critical", 100000), ("high", 10000), ("medium", 0)):
            await kube.create(classes, {"metadata": {"name": f"tensor-fusion-{qos}"}, "value": value})

    async def create_nodes_and_gpus(self) -> None:
        assert self.kube is not None
        for pool in self.pools:
            await self.kube.create(r.GPUPOOLS, {"metadata": {"name": pool}, "spec": {"nodeManagerConfig": {}}})
        for ns in self.namespaces:
            await self.kube.create(r.GPURESOURCEQUOTAS, {"metadata": {"name": "budget", "namespace": ns}, "spec": {
                "total": {"requests": {"tflops": "1000000", "vram": "1000000Gi"},
                          "limits": {"tflops": "2000000", "vram": "2000000Gi"}, "maxWorkers": 1000000}}})

        def node(i: int) -> list[tuple[str, str, Any]]:
            name = self.node(i)
            resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
            return [("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {
                        "kubernetes.io/hostname": name}}}),
                    ("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
                        "allocatable": resources, "capacity": resources,
                        "conditions": [{"type": "Ready", "status": "True"}]}})]

        await self.each(self.args.nodes, node)
        per_gpu = self.pods_per_gpu()

        def gpu(g: int) -> list[tuple[str, str, Any]]:
            name, n = f"gpu-{g:05d}", self.gpu_node(g)
            host = self.node(n)
            held = per_gpu[g]
            base = f"/apis/tensor-fusion.ai/v1/gpus/{name}"
            return [("POST", "/apis/tensor-fusion.ai/v1/gpus", {"metadata": {"name": name, "labels": {
                        tfa.GPU_POOL: self.pool_of_node(n), tfa.MANAGED_BY: host}}}),
                    ("PATCH", f"{base}/status", {"status": {
                        "phase": "Running", "vendor": "NVIDIA", "gpuModel": "H100", "uuid": f"GPU-{name}",
                        "index": g // self.args.nodes, "usedBy": "tensor-fusion", "isolationMode": "soft",
                        "message": "managed", "nodeSelector": {"kubernetes.io/hostname": host},
                        "capacity": {"tflops": str(GPU_TFLOPS), "vram": f"{GPU_VRAM}Gi"},
                        "available": {"tflops": str(GPU_TFLOPS - held * POD_TFLOPS),
                                      "vram": f"{GPU_VRAM - held * POD_VRAM}Gi"}}})]

        await self.each(self.args.gpus, gpu)

    def pods_per_gpu(self) -> list[int]:
        counts = [0] * self.args.gpus
        for p in range(self.args.pods):
            counts[p % self.args.gpus] += 1
        return counts

    async def deployment(self, ns: str, name: str) -> tuple[str, str]:
        """A Deployment and its ReplicaSet (nothing runs them: the pods are ours); their UIDs."""
        assert self.kube is not None
        labels = {"app": name}
        dep = await self.kube.create(r.DEPLOYMENTS, {"metadata": {"name": name, "namespace": ns, "labels": labels},
                                                     "spec": {"replicas": self.args.pods_per_workload,
                                                              "selector": {"matchLabels": labels},
                                                              "template": {"metadata": {"labels": labels},
                                                                           "spec": {"containers": [
                                                                               {"name": "main", "image": "app"}]}}}},
                                     namespace=ns)
        rs = await self.kube.create(r.REPLICASETS, self.replicaset(ns, name, dep["metadata"]["uid"]), namespace=ns)
        return dep["metadata"]["uid"], rs["metadata"]["uid"]

    def replicaset(self, ns: str, name: str, dep_uid: str) -> dict[str, Any]:
        labels = {"app": name}
        return {"metadata": {"name": f"{name}-rs", "namespace": ns, "labels": labels, "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": dep_uid,
                     "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"replicas": self.args.pods_per_workload, "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels},
                                      "spec": {"containers": [{"name": "main", "image": "app"}]}}}}

    def user_pod(self, ns: str, name: str, deployment: str, rs_uid: str, pool: str) -> dict[str, Any]:
        """A pod as the ReplicaSet controller writes it from a template a user wrote; a `name` that
        ends in "-" is its generateName (the ReplicaSet controller names every pod so)."""
        pod = sched.webhook_pod(0)
        meta = pod["metadata"]
        del meta["name"]
        meta.update({"generateName" if name.endswith("-") else "name": name, "namespace": ns,
                     "labels": {**meta["labels"], "app": deployment},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{deployment}-rs",
                                          "uid": rs_uid, "controller": True, "blockOwnerDeletion": True}]})
        meta["annotations"].update({tfa.GPU_POOL: pool, tfa.TFLOPS_REQUEST: str(POD_TFLOPS),
                                    tfa.TFLOPS_LIMIT: str(POD_TFLOPS), tfa.VRAM_REQUEST: f"{POD_VRAM}Gi",
                                    tfa.VRAM_LIMIT: f"{POD_VRAM}Gi"})
        return pod

    async def template(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
        """One Deployment-owned pod admitted and bound by tfusion itself (a controller is running):
        the bound pod, its TensorFusionWorkload, and the names in them to replace in clones."""
        assert self.kube is not None
        ns, name = self.namespaces[0], "tpl"
        dep_uid, rs_uid = await self.deployment(ns, name)
        pod = self.user_pod(ns, "tpl-pod", name, rs_uid, TEMPLATE_POOL)
        await self.kube.create(r.PODS, pod, namespace=ns)
        deadline = time.monotonic() + 120
        while True:
            bound = await self.kube.get(r.PODS, "tpl-pod", namespace=ns)
            if bound["spec"].get("nodeName") and (bound["metadata"].get("annotations") or {}).get(tfa.GPU_IDS):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the template pod was not bound: {json.dumps(bound)[:2000]}")
            await asyncio.sleep(0.1)
        workloads = [w for w in await self.kube.list(r.TENSORFUSIONWORKLOADS, namespace=ns)]
        if len(workloads) != 1:
            raise RuntimeError(f"expected one workload for the template pod, found {len(workloads)}")
        names = {"pod": "tpl-pod", "node": bound["spec"]["nodeName"],
                 "gpu": bound["metadata"]["annotations"][tfa.GPU_IDS], "dep_uid": dep_uid, "rs_uid": rs_uid,
                 "workload": workloads[0]["metadata"]["name"], "pod_uid": bound["metadata"]["uid"]}
        return bound, workloads[0], names

    async def clone_pods(self, pod: dict[str, Any], workload: dict[str, Any], names: dict[str, str]) -> None:
        """`--pods` copies of the bound template pod, `--pods-per-workload` per Deployment."""
        assert self.kube is not None
        for item in (pod, workload):
            meta = item["metadata"]
            for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
                meta.pop(key, None)
        pod_text = json.dumps({k: v for k, v in pod.items() if k != "status"})
        workload_text = json.dumps({k: v for k, v in workload.items() if k != "status"})
        status = {"status": {**pod.get("status", {}), "phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}}
        per = self.args.pods_per_workload
        deployments = -(-self.args.pods // per)
        uids: list[tuple[str, str]] = [("", "")] * deployments

        def dep_name(d: int) -> str:
            return f"d-{d:05d}"

        def ns_of(d: int) -> str:
            return self.namespaces[d % len(self.namespaces)]

        def deploy(d: int) -> list[tuple[str, str, Any]]:
            ns, name = ns_of(d), dep_name(d)
            labels = {"app": name}
            return [("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", {
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"replicas": per, "selector": {"matchLabels": labels}, "template": {
                    "metadata": {"labels": labels}, "spec": {"containers": [{"name": "main", "image": "app"}]}}}})]

        answers = await self.each(deployments, deploy)
        dep_uids = [json.loads(a[0])["metadata"]["uid"] for a in answers]

        def replicaset(d: int) -> list[tuple[str, str, Any]]:
            ns = ns_of(d)
            return [("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", self.replicaset(ns, dep_name(d),
                                                                                          dep_uids[d]))]

        answers = await self.each(deployments, replicaset)
        uids = [(dep_uids[d], json.loads(a[0])["metadata"]["uid"]) for d, a in enumerate(answers)]
        tpl_ns = self.namespaces[0]

        def swap(text: str, d: int, node: int, extra: dict[str, str]) -> Any:
            pool = self.pool_of_node(node)
            pairs = {names["dep_uid"]: uids[d][0], names["rs_uid"]: uids[d][1], f'"{tpl_ns}"': f'"{ns_of(d)}"',
                     '"tpl-rs"': f'"{dep_name(d)}-rs"', '"tpl"': f'"{dep_name(d)}"', TEMPLATE_POOL: pool,
                     f'"{names["workload"]}"': f'"{dep_name(d)}-workload"', **extra}
            for old, new in pairs.items():
                text = text.replace(old, new)
            return json.loads(text)

        def workload_of(d: int) -> list[tuple[str, str, Any]]:
            ns = ns_of(d)
            # a Deployment's pods all sit in one pool: that of its first pod's GPU
            node = self.gpu_node((d * per) % self.args.gpus)
            return [("POST", f"/apis/tensor-fusion.ai/v1/namespaces/{ns}/tensorfusionworkloads",
                     swap(workload_text, d, node, {}))]

        await self.each(deployments, workload_of)

        def clone(p: int) -> list[tuple[str, str, Any]]:
            d = p // per
            g = p % self.args.gpus
            n = self.gpu_node(g)
            name = f"{dep_name(d)}-{p % per:03d}"
            body = swap(pod_text, d, n, {f'"{names["pod"]}"': f'"{name}"', f'"{names["node"]}"': f'"{self.node(n)}"',
                                         f'"{names["gpu"]}"': f'"gpu-{g:05d}"'})
            with_index(body, clone_index(p // self.args.nodes, n))
            ns = ns_of(d)
            return [("POST", f"/api/v1/namespaces/{ns}/pods", body),
                    ("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", status)]

        await self.each(self.args.pods, clone)

    async def remove_template(self) -> None:
        """Its Deployment goes, and the garbage collector takes the rest; nothing runs the pod's
        finalizer now, so this removes it."""
        assert self.kube is not None
        ns = self.namespaces[0]
        await self.kube.delete(r.DEPLOYMENTS, "tpl", namespace=ns)
        # the pod webhook (failurePolicy Fail) would refuse the clones while no controller runs
        for config in await self.kube.list(MUTATING_WEBHOOK_CONFIGURATIONS):
            await self.kube.delete(MUTATING_WEBHOOK_CONFIGURATIONS, config["metadata"]["name"])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                pod = await self.kube.get(r.PODS, "tpl-pod", namespace=ns)
            except NotFound:
                return
            if pod["metadata"].get("deletionTimestamp") and pod["metadata"].get("finalizers"):
                with contextlib.suppress(NotFound):
                    await self.kube.patch(r.PODS, "tpl-pod", {"metadata": {"finalizers": None}}, namespace=ns)
            await asyncio.sleep(0.1)
        raise RuntimeError("the template pod was not deleted")


def clone_index(nth_on_node: int, node: int) -> int:
    """The pod index of the `nth_on_node` pod on node number `node`: distinct on one node, as the
    node-level index lock keeps them, and spread over all 128 across nodes, as the webhook's counter
    hands them out. (Every node holding the same few indices would leave a new pod given one of
    them no node at all: the `unscheduled` pods of earlier runs.)"""
    return (nth_on_node + node) % tfa.POD_INDEX_MAX + 1


def with_index(pod: dict[str, Any], index: int) -> None:
    """The pod holds pod index `index`: its annotation and its containers' index resource."""
    resource, count = encode_pod_index(index)
    pod["metadata"]["annotations"][tfa.INDEX] = str(index)
    for container in pod["spec"]["containers"]:
        for part in ("limits", "requests"):
            amounts = (container.get("resources") or {}).get(part)
            if amounts:
                for name in [n for n in amounts if n.startswith(tfa.INDEX_RESOURCE_PREFIX)]:
                    del amounts[name]
                    amounts[resource] = str(count)


# --- measuring a controller ---------------------------------------------------------------------


async def conditions(http: httpx.AsyncClient) -> tuple[int, dict[str, tuple[bool, str]]]:
    answer = await http.get("/readyz")
    body = answer.json()
    return answer.status_code, {c["name"]: (c["ready"], c["message"]) for c in body.get("conditions", [])}


async def wait_state(url: str, proc: subprocess.Popen[bytes], want: str, seconds: float,
                     polls: list[int] | None = None) -> float:
    """Poll /readyz until 200 and the allocator condition's message starts with `want` ("leader:
    recovered" or "standby"); the monotonic time it was first seen. Each poll made is appended to
    `polls` (a count the caller keeps)."""
    deadline = time.monotonic() + seconds
    last: Any = None
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the controller at {url} exited with {proc.returncode}")
            if polls is not None:
                polls.append(1)
            with contextlib.suppress(httpx.HTTPError, ValueError):
                status, found = await conditions(http)
                last = (status, found.get("allocator"))
                if status == 200 and found.get("allocator", (False, ""))[1].startswith(want):
                    return time.monotonic()
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the controller at {url} did not reach {want!r} in {seconds:g} s: {last}")


async def cpu_per_poll(url: str, proc: subprocess.Popen[bytes], count: int = 200) -> float:
    """The controller's CPU seconds for one /readyz answer, from `count` polls in a row."""
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        before = cpu_s(proc.pid)
        for _ in range(count):
            await conditions(http)
        return (cpu_s(proc.pid) - before) / count


async def settled_rss_kb(proc: subprocess.Popen[bytes], seconds: float = 3.0) -> int:
    """VmRSS once the process has had a moment after recovery (the leader's first status writes)."""
    await asyncio.sleep(seconds)
    return rss_kb(proc.pid)


async def queues_drained(url: str, proc: subprocess.Popen[bytes], seconds: float) -> float:
    """Poll the controller's work-queue depths and pool gauges (`/metrics?name[]=...`, which collects
    those families alone) until every queue is empty and the recorder's first tick has given the
    pools their worker counts; the monotonic time it was first seen."""
    deadline = time.monotonic() + seconds
    names = {"name[]": ["tfusion_workqueue_depth", "tfusion_pool_workers"]}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the controller at {url} exited with {proc.returncode}")
            families = {family.name: family.samples for family in
                        text_string_to_metric_families((await http.get("/metrics", params=names)).text)}
            depth = sum(sample.value for sample in families.get("tfusion_workqueue_depth", ()))
            if depth == 0 and families.get("tfusion_pool_workers"):
                return time.monotonic()
            await asyncio.sleep(1.0)
    raise RuntimeError(f"the controller at {url} still had keys queued or no recorder tick after {seconds:g} s")


async def one_controller_rss(cluster: Cluster, identity: str, timeout: float) -> tuple[int, float]:
    proc, url, started = cluster.start_controller(identity)
    try:
        ready = await wait_state(url, proc, "leader: recovered", timeout)
        return await settled_rss_kb(proc), ready - started
    finally:
        stop(proc)


async def failovers(cluster: Cluster, run: int, timeout: float, webhook_port: int) -> dict[str, Any]:
    """ready_s, rss and the three hand-overs, on fresh replicas; the last leader, whose webhook
    listens on `webhook_port` (where the webhook Service points), is left running.

    Two standbys sync together while the first leader is measured (one listing of the cluster
    less per run than a standby started for each hand-over): the first leader releases its Lease
    (one of them takes it), the winner is killed (the other takes it when the Lease expires), and
    that one is killed and started again under its own identity."""
    a, a_url, a_started = cluster.start_controller(f"a-{run}")
    polls: list[int] = []
    a_ready = await wait_state(a_url, a, "leader: recovered", timeout, polls)
    ready_cpu = cpu_s(a.pid)
    # the standbys sync meanwhile: they change neither the leader's RSS nor its CPU seconds per poll
    standbys = {name: cluster.start_controller(name)[:2] for name in (f"b-{run}", f"c-{run}")}
    result: dict[str, Any] = {"ready_s": a_ready - a_started, "rss_kb": await settled_rss_kb(a)}
    result["ready_cpu_s"] = ready_cpu - len(polls) * await cpu_per_poll(a_url, a)
    result["readyz_polls"] = len(polls)
    for proc, url in standbys.values():
        await wait_state(url, proc, "standby", timeout)
    await asyncio.sleep(1.0)  # the standbys' informers see the leader's last writes
    a.terminate()  # releases the Lease
    released = time.monotonic()
    winner, recovered = await first_recovered(standbys, timeout)
    result["failover_release_s"] = recovered - released
    a.wait()
    leader, _ = standbys.pop(winner)
    other = next(iter(standbys))
    proc, url = standbys[other]
    await asyncio.sleep(1.0)  # the remaining standby sees the new leader's first writes
    leader.send_signal(signal.SIGKILL)
    leader.wait()
    killed = time.monotonic()
    result["failover_kill_s"] = await wait_state(url, proc, "leader: recovered", timeout + 30) - killed
    # a same-identity restart after kill -9: takes its own Lease back at once
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = time.monotonic()
    last, last_url, _ = cluster.start_controller(other, webhook_port=webhook_port)
    recovered = await wait_state(last_url, last, "leader: recovered", timeout)
    result["failover_restart_s"] = recovered - killed
    result["settle_s"] = await queues_drained(last_url, last, timeout) - recovered
    result["leader"] = (last, last_url)
    return result


async def first_recovered(replicas: dict[str, tuple[subprocess.Popen[bytes], str]],
                          timeout: float) -> tuple[str, float]:
    """The replica of `replicas` that becomes the recovered leader first, and when."""
    waits = {asyncio.ensure_future(wait_state(url, proc, "leader: recovered", timeout)): name
             for name, (proc, url) in replicas.items()}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    first = min(done, key=lambda task: task.result())
    return waits[first], first.result()


async def schedule_new(cluster: Cluster, run: int) -> dict[str, Any]:
    """`--new-pods` Deployment-owned pods through the webhook, timed from create to bind."""
    args = cluster.args
    assert cluster.kube is not None
    per = args.pods_per_workload
    deployments = -(-args.new_pods // per)
    names = [(cluster.namespaces[d % len(cluster.namespaces)], f"new{run}-{d:05d}") for d in range(deployments)]
    # their Deployments and ReplicaSets ahead of the timing, 16 at a time (one by one took seconds a run)
    rs_uids: list[str] = [""] * deployments
    limit = asyncio.Semaphore(16)

    async def made(d: int) -> None:
        async with limit:
            rs_uids[d] = (await cluster.deployment(*names[d]))[1]

    await asyncio.gather(*(made(d) for d in range(deployments)))
    targets = [(ns, name, rs_uid) for (ns, name), rs_uid in zip(names, rs_uids, strict=True)]
    bound_at: dict[str, float] = {}
    created_at: dict[str, float] = {}
    done = asyncio.Event()
    relists: list[int] = []
    watcher = asyncio.create_task(sched.watch_binds(cluster.kube, bound_at, args.new_pods, done, namespace=None,
                                                    prefix=f"new{run}-", relists=relists))
    await asyncio.sleep(0.5)
    first = time.monotonic()
    conns = await cluster.connections()
    numbers = iter(range(args.new_pods))

    bodies: dict[int, bytes] = {}

    def pod_of(d: int) -> bytes:
        """Deployment d's pod, the same for each of its pods (the API server names them)."""
        if d not in bodies:
            ns, dep, rs_uid = targets[d]
            pool = cluster.pools[d % len(cluster.pools)]
            bodies[d] = json.dumps(cluster.user_pod(ns, f"{dep}-rs-", dep, rs_uid, pool)).encode()
        return bodies[d]

    async def creator(conn: Any) -> None:
        for i in numbers:
            d = i // per
            ns = targets[d][0]
            status, body = await conn.request("POST", f"/api/v1/namespaces/{ns}/pods", pod_of(d))
            if status != 201:
                raise RuntimeError(f"pod create answered {status}: {body[:300]!r}")
            created_at[f"{ns}/{_CREATED.decode(body).metadata.name}"] = time.monotonic()

    await asyncio.gather(*(creator(c) for c in conns))
    for conn in conns:
        conn.close()
    await sched.wait_bound_or_stalled(done, bound_at, args.timeout)
    watcher.cancel()
    if len(bound_at) < args.new_pods:  # a throughput over the pods that did bind would hide the rest
        raise RuntimeError(f"run {run}: {args.new_pods - len(bound_at)} of {args.new_pods} new pods were not bound "
                           f"{args.timeout:g} s after the last bind")
    last = max(bound_at.values()) if bound_at else time.monotonic()
    latencies = sorted(max(0.0, bound_at[n] - created_at[n]) * 1000 for n in bound_at if n in created_at)
    return {"pods_per_s": len(bound_at) / max(1e-9, last - first),
            "bind_p50_ms": statistics.median(latencies) if latencies else float("nan"),
            "bind_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies
            else float("nan"), "watch_relists": len(relists)}


class _Named(msgspec.Struct):
    name: str


class _Created(msgspec.Struct):
    metadata: _Named


_CREATED = msgspec.json.Decoder(_Created)


class _CheckedMeta(msgspec.Struct):
    annotations: dict[str, str] = {}


class _CheckedSpec(msgspec.Struct, rename="camel"):
    node_name: str = ""


class _CheckedPod(msgspec.Struct):
    metadata: _CheckedMeta
    spec: _CheckedSpec


class _PodPage(msgspec.Struct):
    items: list[_CheckedPod]
    metadata: dict[str, Any] = {}


def _checked_pods(body: bytes) -> dict[str, Any]:
    """A page of pods with only what `check` reads (each pod's annotations and node): the rest of
    130,000 pods (about 7 KB each) is skipped unbuilt, in a fraction of a full decode's time."""
    return msgspec.to_builtins(msgspec.json.decode(body, type=_PodPage))  # type: ignore[no-any-return]


async def check(cluster: Cluster) -> tuple[int, int]:
    """(unscheduled, double allocations) over every TF pod (label-selected by the server) and GPU
    of the cluster."""
    assert cluster.kube is not None
    tf_pods: list[dict[str, Any]] = []
    with collector_paused():  # decoded JSON has no cycles; full passes over it doubled the time
        async for page in cluster.kube.list_pages(r.PODS, label_selector=f"{tfa.ENABLED}=true", limit=2000,
                                                  decode=_checked_pods):
            tf_pods.extend(page.items)
        gpus = list(await cluster.kube.list(r.GPUS, limit=2000))
    unscheduled = sum(1 for p in tf_pods if not p["spec"].get("nodeName"))
    return unscheduled, sched.count_double_allocations(tf_pods, gpus)


async def in_process_memory(kubeconfig: Path) -> dict[str, Any]:
    """Run in a child process of this script: the controller in-process (no election) until its
    allocator has recovered, then `sys.getsizeof` walks of the allocator and the pod cache."""
    import anyio

    from tfusion.controller import role
    from tfusion.settings import Settings

    settings = Settings.load({"kube": str(kubeconfig), "leader_elect": False, "controller_listen": "127.0.0.1:0",
                              "health_probe_listen": "127.0.0.1:0", "webhook_listen": "127.0.0.1:0"},
                             roles=("controller",))
    result: dict[str, Any] = {}
    async with anyio.create_task_group() as tg:
        runtime = await tg.start(role.run, settings)
        service = runtime.allocation
        deadline = time.monotonic() + 600
        while service.allocator is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the in-process controller did not recover")
            await anyio.sleep(0.1)
        pods = runtime.informer(r.PODS)
        result = {"allocator_mb": round(deep_size(service.allocator) / 2**20, 1),
                  "cache_kb_per_pod": round(deep_size(pods._store) / max(1, len(pods)) / 1024, 2),
                  "cached_pods": len(pods)}
        tg.cancel_scope.cancel()
    return result


def deep_size(root: object) -> int:
    """Bytes of every object reachable from `root` (each once), not counting classes, modules and
    functions, which belong to the program rather than the data."""
    import types

    seen: set[int] = set()
    stack = [root]
    total = 0
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


async def build(cluster: Cluster, timeout: float) -> dict[str, Any]:
    with cluster.phase("empty_cluster"):
        cluster.start_apiserver()
        await cluster.create_base()
        empty_kb, _ = await one_controller_rss(cluster, "empty", timeout)
    started = time.monotonic()
    with cluster.phase("nodes_and_gpus"):
        await cluster.create_nodes_and_gpus()
    # a controller on the nodes and GPUs: their memory, and the template pod through its webhook
    with cluster.phase("template_pod"):
        webhook_port = sched.free_port()
        assert cluster.kube is not None
        await sched.webhook_service(cluster.kube, webhook_port)
        proc, url, _ = cluster.start_controller("template", webhook_port=webhook_port)
        try:
            await wait_state(url, proc, "leader: recovered", timeout)
            gpus_kb = await settled_rss_kb(proc)
            pod, workload, names = await cluster.template()
        finally:
            stop(proc)
        await cluster.remove_template()
    with cluster.phase("bound_pods"):
        await cluster.clone_pods(pod, workload, names)
    return {"build_s": round(time.monotonic() - started, 1), "rss_empty_kb": empty_kb, "rss_gpus_kb": gpus_kb,
            "webhook_port": webhook_port}


async def main_async(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    began = time.monotonic()
    built = await build(cluster, args.timeout_ready)
    assert cluster.kube is not None
    await cluster.kube.delete(r.SERVICES, "tensor-fusion-webhook", namespace="tensor-fusion-sys")
    runs: list[dict[str, Any]] = []
    for run in range(args.runs):
        webhook_port = sched.free_port()
        if run == 0:
            await sched.webhook_service(cluster.kube, webhook_port)
        else:
            await cluster.kube.patch(r.SERVICES, "tensor-fusion-webhook", {"spec": {"ports": [
                {"port": 443, "targetPort": webhook_port}]}}, namespace="tensor-fusion-sys")
        with cluster.phase(f"run_{run}_failovers"):
            figures = await failovers(cluster, run, args.timeout_ready, webhook_port)
        leader, _ = figures.pop("leader")
        with cluster.phase(f"run_{run}_new_pods"):
            figures.update(await schedule_new(cluster, run))
        stop(leader)
        runs.append(figures)
    memory: dict[str, Any] = {}
    # the allocator walk (a memory figure, no time) runs beside the check, which only reads
    with cluster.phase("check_and_allocator_memory" if args.allocator_memory else "check"):
        walk = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--in-process-memory", str(cluster.kubeconfig),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE) if args.allocator_memory else None
        unscheduled, doubles = await check(cluster)
        if walk is not None:
            out, err = await asyncio.wait_for(walk.communicate(), 900)
            memory = json.loads(out) if walk.returncode == 0 else {"allocator_error": err[-500:].decode()}
    full_kb = statistics.median(run["rss_kb"] for run in runs)
    result: dict[str, Any] = {
        "nodes": args.nodes, "gpus": args.gpus, "pods": args.pods, "new_pods": args.new_pods, "runs": args.runs,
        "namespaces": len(cluster.namespaces), "pools": len(cluster.pools),
        "workloads": -(-args.pods // args.pods_per_workload), "build_s": built["build_s"],
        "ready_s": spread([run["ready_s"] for run in runs]),
        "ready_cpu_s": spread([run["ready_cpu_s"] for run in runs]),
        "rss_mb": spread([run["rss_kb"] / 1024 for run in runs], 1),
        "rss_empty_mb": round(built["rss_empty_kb"] / 1024, 1),
        "rss_nodes_gpus_mb": round(built["rss_gpus_kb"] / 1024, 1),
        "rss_kb_per_pod": round((full_kb - built["rss_gpus_kb"]) / max(1, args.pods), 2),
        "rss_kb_per_gpu": round((built["rss_gpus_kb"] - built["rss_empty_kb"]) / max(1, args.gpus), 2),
        "rss_definition": "VmRSS of the leader once recovered; per_pod = (full - nodes+GPUs only) / pods "
                          "(workloads and Deployments included); per_gpu = (nodes+GPUs only - empty) / gpus "
                          "(nodes and pools included)",
        **memory,
        "failover_kill_s": spread([run["failover_kill_s"] for run in runs]),
        "failover_restart_s": spread([run["failover_restart_s"] for run in runs]),
        "failover_release_s": spread([run["failover_release_s"] for run in runs]),
        "settle_s": spread([run["settle_s"] for run in runs]),
        "lease": {"duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2},
        "pods_per_s": spread([run["pods_per_s"] for run in runs], 1),
        "bind_p50_ms": spread([run["bind_p50_ms"] for run in runs], 1),
        "bind_p99_ms": spread([run["bind_p99_ms"] for run in runs], 1),
        "watch_relists": sum(run["watch_relists"] for run in runs),
        "unscheduled": unscheduled, "double_allocations": doubles,
        "phases_s": cluster.phases, "total_s": round(time.monotonic() - began, 1),
    }
    await cluster.kube.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=20000)
    parser.add_argument("--pods", type=int, default=100000)
    parser.add_argument("--new-pods", type=int, default=10000)
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--pods-per-workload", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=30.0, help="give up after this long without a bind")
    parser.add_argument("--timeout-ready", type=float, default=300.0, help="the most a replica may take to lead")
    parser.add_argument("--allocator-memory", action=argparse.BooleanOptionalAction, default=True,
                        help="walk the allocator's and the pod cache's objects in a controller run in-process")
    parser.add_argument("--controller-log-level", default="warn")
    parser.add_argument("--workdir", type=Path, help="keep the state and logs here (default: a temporary folder)")
    parser.add_argument("--compare-nodes", type=int, default=1000,
                        help="then the same at this many nodes, for pods_per_s_ratio (0: not; skipped unless "
                             "fewer than --nodes)")
    parser.add_argument("--in-process-memory", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    began = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on the way out
    if args.in_process_memory:
        import anyio

        print(json.dumps(anyio.run(in_process_memory, Path(args.in_process_memory))))
        return
    if args.pods + args.new_pods * args.runs > args.gpus * (GPU_TFLOPS // POD_TFLOPS):
        parser.error(f"--pods + --new-pods x --runs ({args.pods + args.new_pods * args.runs}) do not fit on "
                     f"--gpus {args.gpus} ({GPU_TFLOPS // POD_TFLOPS} pods each)")
    if -(-args.pods // args.nodes) > tfa.POD_INDEX_MAX:
        parser.error(f"--pods {args.pods} on --nodes {args.nodes}: more than {tfa.POD_INDEX_MAX} pods on a node "
                     "cannot hold distinct pod indices")
    if args.gpus % args.nodes:
        parser.error(f"--gpus {args.gpus} must be a multiple of --nodes {args.nodes} (as many GPUs on every node)")
    with contextlib.ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tfusion-scale-bench-")))
        work.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(args, work)
        try:
            result = asyncio.run(main_async(args, cluster))
        except BaseException:
            for log in sorted(work.glob("*.log")):
                sys.stderr.write(f"--- {log.name} (tail)\n{log.read_text(errors='replace')[-3000:]}\n")
            raise
        finally:
            cluster.stop_all()
        if 0 < args.compare_nodes < args.nodes:
            result.update(compare(args, work / "compare", result["pods_per_s"]["median"]))
        result["command_s"] = round(time.monotonic() - began, 1)
        print(json.dumps(result))
        if result["double_allocations"] or result["unscheduled"] or result.get("compared", {}).get("failed"):
            sys.exit(1)


def compare(args: argparse.Namespace, work: Path, pods_per_s: float) -> dict[str, Any]:
    """This command again at `--compare-nodes` nodes, in a child process, after the full-size run: the
    same new pods (Deployments of the same size, the same runs and clients), the GPUs per node kept,
    the bound pods scaled down with the nodes as far as the runs leave room (half the room left, as
    at full size most GPUs keep room). `pods_per_s_ratio`: the full size's median over its median,
    what is left of the throughput when only the cluster's size changes."""
    nodes = args.compare_nodes
    gpus = args.gpus // args.nodes * nodes
    room = gpus * (GPU_TFLOPS // POD_TFLOPS) - args.new_pods * args.runs
    pods = min(args.pods * nodes // args.nodes, room // 2)
    command = [sys.executable, __file__, "--nodes", str(nodes), "--gpus", str(gpus), "--pods", str(max(0, pods)),
               "--new-pods", str(args.new_pods), "--runs", str(args.runs), "--clients", str(args.clients),
               "--namespaces", str(args.namespaces), "--pods-per-workload", str(args.pods_per_workload),
               "--timeout", str(args.timeout), "--timeout-ready", str(args.timeout_ready),
               "--controller-log-level", args.controller_log_level, "--no-allocator-memory", "--compare-nodes", "0",
               "--workdir", str(work)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=sys.stderr) as done:
        try:
            out, _ = done.communicate(timeout=1800)
        except BaseException:  # SIGTERM (not subprocess.run's SIGKILL): it stops the servers it started
            done.terminate()
            done.wait(60)
            raise
    lines = out.decode().strip().splitlines()
    if not lines:
        return {"compared": {"nodes": nodes, "failed": f"exit {done.returncode}, no JSON"}}
    found = json.loads(lines[-1])
    compared = {key: found[key] for key in ("nodes", "gpus", "pods", "new_pods", "runs", "pods_per_s", "bind_p50_ms",
                                            "bind_p99_ms", "unscheduled", "double_allocations", "total_s")}
    if done.returncode:
        compared["failed"] = f"exit {done.returncode}"
    return {"compared": compared, "pods_per_s_ratio": round(pods_per_s / compared["pods_per_s"]["median"], 3)}


if __name__ == "__main__":
    main()
