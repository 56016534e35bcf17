"""The built-in scheduler end to end, over real HTTP, printed as ONE JSON object.

Three processes: `tfusion --role=apiserver` (the embedded API server, fresh state), `tfusion
--role=controller` (the leader, no election, its built-in scheduler) and this one, which creates
the cluster through the API server: one GPUPool, `--nodes` Nodes (Ready, 64 CPU, 512Gi, 110 pods)
and `--gpus` GPUs spread over them (100 TFLOPS, 80Gi each, reported Running), then `--pods`
GPU pods from `--clients` concurrent clients. By default the pods are created as a user writes
them (label `tensor-fusion.ai/enabled: "true"`, pool and request annotations, no schedulerName)
and the controller's pod webhook, which the controller registers with the API server, mutates
them (`"webhook": true`); with `--no-webhook` they are created already mutated (schedulerName
`tensor-fusion-scheduler`, the worker label), as the webhook would leave them. Each pod asks for
20 TFLOPS and 16Gi of one GPU, so the cluster holds them all.

A watch on pods records when each pod is first seen bound. Reported:
- `pods_per_s`: pods / (last bind seen - first create sent);
- `bind_p50_ms`, `bind_p99_ms`: from a pod's create answer to its bind seen on the watch;
- `unscheduled`: pods not bound when the run ends (after `--timeout` seconds without progress);
- `double_allocations`: recomputed at the end from every pod's `gpu-ids` and its request against
  each GPU's capacity: GPUs whose summed TFLOPS or VRAM exceeds capacity, plus pods that name a
  GPU on another node than the one they are bound to.
- `workloads_not_owned`: bare pods (`pending-owned-workload`) whose workload, once the run has
  settled, is missing or not controlled by the pod (the pod reconciler creates it after the pod);
- `scheduler_attempts`: the controller's scheduling attempts by result, read from its /metrics
  (more than `pods` means some pods were parked as unschedulable and tried again).

With `--owner deployment` the pods belong to `--deployments` Deployments, as the ReplicaSet
controller would create them: each Deployment and one ReplicaSet it controls (replicas: its share of
the pods) are created first, and each pod carries `generateName` and a controller ownerReference to
its ReplicaSet, so the webhook names the Deployment's workload (`--owner none`, the default: bare
pods, each its own workload).

What each pod costs, read from the processes under test (meaningful on a busy machine, where the
wall-clock figures are not): the API server runs with its requests counted (_instrument.py), and
once every pod is bound the run waits until no write has come for `--settle` seconds (the
reconcilers' follow-up writes count too), then reports `writes_per_pod` (every create, update,
patch and delete, the benchmark's own pod create included), `writes_per_pod_by` (per "verb
resource"), `reads_per_pod` (gets and lists), and `controller_cpu_ms_per_pod` /
`apiserver_cpu_ms_per_pod` (user + system CPU of each process from the first create to the
settled end), and `benchmark_cpu_ms_per_pod` (this process's, the load it adds to the same cores).
`--profile PATH` writes the controller's cProfile stats of the same stretch to PATH.
The run exits non-zero when a pod is left unscheduled, a GPU is double-allocated or a bare pod
has no workload of its own.

With `--gangs` the pods are gang members (groups of 4 and 8 alternating, created already mutated:
the webhook stamps gang annotations only on pods of a controller with replicas), each group
placed all or none by the built-in scheduler; also reported: `groups_per_s` (complete groups /
(last bind - first create)), `groups`, `complete_groups` and `partial_gangs` (groups with some but
not all members bound at the end: 0 expected).

Usage: python benchmarks/scheduling.py [--nodes 1000] [--gpus 4000] [--pods 10000] [--clients 32]
       [--owner none|deployment] [--deployments 10] [--gangs] [--profile PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib.util
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _processes import free_ports, stop
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tfusion.api import annotations as tfa
from tfusion.api.crds import all_crds
from tfusion.api.quantity import Quantity
from tfusion.kube import resources as r
from tfusion.kube.client import Gone, KubeClient

# the minimal keep-alive HTTPS client of the API server benchmark: the creates must cost this
# process little, or on a small machine it starves the two processes under test
_spec = importlib.util.spec_from_file_location("apibench", Path(__file__).resolve().parent / "apiserver.py")
assert _spec is not None and _spec.loader is not None
apibench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(apibench)

POOL = "bench-pool"
GPU_TFLOPS, GPU_VRAM = "100", "80Gi"
POD_TFLOPS, POD_VRAM = "20", "16Gi"
SCHEDULER = "tensor-fusion-scheduler"


def raw_server(kubeconfig: Path) -> Any:
    import yaml

    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    host, port = cluster["server"].split("//")[1].rsplit(":", 1)
    tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return apibench.Server(host, int(port), config["users"][0]["user"]["token"], tls)


def free_port() -> int:
    return free_ports(1)[0]


INSTRUMENT = Path(__file__).resolve().parent / "_instrument.py"
COUNTS_PATH = "/tfusion-bench/requests"
READ_VERBS = ("get", "list", "watch")


def start(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    """`tfusion ARGS` through _instrument.py (`env` switches its counting and profiling on)."""
    return subprocess.Popen([sys.executable, str(INSTRUMENT), *args, "--log-level", "warn"],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), env={**os.environ, **env})


def cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU the process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def request_counts(server: Any) -> dict[str, int]:
    """The API server's requests so far, {"verb resource": n} (_instrument.py)."""
    conn = await apibench.Connection(server).open()
    try:
        status, body = await conn.request("GET", COUNTS_PATH)
    finally:
        conn.close()
    if status != 200:
        raise RuntimeError(f"{COUNTS_PATH} answered {status}: {body[:200]!r}")
    counts: dict[str, int] = json.loads(body)
    return counts


def writes(counts: dict[str, int]) -> int:
    return sum(n for key, n in counts.items() if key.split(" ", 1)[0] not in READ_VERBS)


async def settled_counts(server: Any, settle: float, limit: float = 120) -> dict[str, int]:
    """The request counts once no write has come for `settle` seconds (at most `limit` seconds)."""
    counts = await request_counts(server)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        await asyncio.sleep(settle)
        now = await request_counts(server)
        # the counting GETs themselves are not counted; the bind watch's events are reads
        if writes(now) == writes(counts):
            return now
        counts = now
    return counts


def per_pod(before: dict[str, int], after: dict[str, int], pods: int, reads: bool) -> dict[str, float]:
    keys = sorted(k for k in after if (k.split(" ", 1)[0] in READ_VERBS) == reads)
    out = {k: round((after[k] - before.get(k, 0)) / pods, 3) for k in keys}
    return {k: v for k, v in out.items() if v}


def wait_for(path: Path, proc: subprocess.Popen[bytes], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


async def gather_limited(limit: int, coros: list[Any]) -> None:
    semaphore = asyncio.Semaphore(limit)

    async def one(coro: Any) -> None:
        async with semaphore:
            await coro

    await asyncio.gather(*(one(c) for c in coros))


async def create_cluster(kube: KubeClient, nodes: int, gpus: int, clients: int) -> None:
    for crd in all_crds():
        await kube.create(r.CUSTOMRESOURCEDEFINITIONS, crd)
    for _ in range(200):
        try:
            await kube.list(r.GPUS)
            await kube.list(r.GPUPOOLS)
            break
        except Exception:
            await asyncio.sleep(0.05)
    await kube.create(r.GPUPOOLS, {"metadata": {"name": POOL}, "spec": {"nodeManagerConfig": {}}})

    async def node(i: int) -> None:
        name = f"node-{i:04d}"
        await kube.create(r.NODES, {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        await kube.patch(r.NODES, name, {"status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")

    async def gpu(i: int) -> None:
        name, host = f"gpu-{i:05d}", f"node-{i % nodes:04d}"
        await kube.create(r.GPUS, {"metadata": {"name": name, "labels": {tfa.GPU_POOL: POOL, tfa.MANAGED_BY: host}}})
        await kube.patch(r.GPUS, name, {"status": {
            "phase": "Running", "vendor": "NVIDIA", "gpuModel": "H100", "uuid": f"GPU-{name}", "index": i // nodes,
            "usedBy": "tensor-fusion", "isolationMode": "soft", "message": "managed",
            "nodeSelector": {"kubernetes.io/hostname": host},
            "capacity": {"tflops": GPU_TFLOPS, "vram": GPU_VRAM},
            "available": {"tflops": GPU_TFLOPS, "vram": GPU_VRAM}}}, subresource="status")

    await gather_limited(clients, [node(i) for i in range(nodes)])
    await gather_limited(clients, [gpu(i) for i in range(gpus)])


def webhook_pod(i: int) -> dict[str, Any]:
    """A pod as a user writes it: the webhook adds schedulerName, the worker label and the defaults."""
    name = f"w-{i:05d}"
    return {"metadata": {"name": name, "namespace": "default", "labels": {tfa.ENABLED: "true"},
                         "annotations": {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: POD_TFLOPS,
                                         tfa.TFLOPS_LIMIT: POD_TFLOPS, tfa.VRAM_REQUEST: POD_VRAM,
                                         tfa.VRAM_LIMIT: POD_VRAM}},
            "spec": {"containers": [{"name": "main", "image": "app",
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}


def owned_pod(i: int, owner: dict[str, Any]) -> dict[str, Any]:
    """webhook_pod as a ReplicaSet controller creates it: generateName, the template's labels and
    the ReplicaSet as controller."""
    pod = webhook_pod(i)
    meta = pod["metadata"]
    del meta["name"]
    rs = owner["metadata"]
    meta["generateName"] = rs["name"] + "-"
    meta["labels"].update(rs["labels"])
    meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["name"],
                                "uid": rs["uid"], "controller": True, "blockOwnerDeletion": True}]
    return pod


async def create_deployments(kube: KubeClient, count: int, pods: int) -> list[dict[str, Any]]:
    """`count` Deployments, each with the ReplicaSet it controls (replicas: its share of `pods`);
    the ReplicaSets as created."""
    made: list[dict[str, Any]] = []
    for d in range(count):
        name, share = f"app-{d:03d}", pods // count + (1 if d < pods % count else 0)
        labels = {"app": name}
        template = {"metadata": {"labels": {**labels, tfa.ENABLED: "true"}},
                    "spec": {"containers": [{"name": "main", "image": "app"}]}}
        deployment = await kube.create(r.DEPLOYMENTS, {
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"replicas": share, "selector": {"matchLabels": labels}, "template": template}},
            namespace="default")
        rs_labels = {**labels, "pod-template-hash": f"h{d:03d}"}
        replicaset = await kube.create(r.REPLICASETS, {
            "metadata": {"name": f"{name}-h{d:03d}", "namespace": "default", "labels": rs_labels,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                              "uid": deployment["metadata"]["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"replicas": share, "selector": {"matchLabels": rs_labels},
                     "template": {**template, "metadata": {"labels": {**rs_labels, tfa.ENABLED: "true"}}}}},
            namespace="default")
        made.append(replicaset)
    return made


GANG_SIZES = (4, 8)


def gang_groups(pods: int) -> list[tuple[int, int]]:
    """Each pod's (group number, group size): groups of 4 and 8 alternating (the last one takes what
    is left)."""
    groups: list[tuple[int, int]] = []
    number = 0
    while len(groups) < pods:
        size = min(GANG_SIZES[number % len(GANG_SIZES)], pods - len(groups))
        groups.extend([(number, size)] * size)
        number += 1
    return groups


def gang_member(i: int, groups: list[tuple[int, int]]) -> dict[str, Any]:
    """worker_pod with the gang annotations the webhook stamps."""
    pod = worker_pod(i)
    number, size = groups[i]
    pod["metadata"]["annotations"].update({tfa.GANG_GROUP_KEY: f"default/gang-{number}",
                                           tfa.GANG_REQUIRED_MEMBERS: str(size), tfa.GANG_DESIRED_MEMBERS: str(size)})
    return pod


def gang_counts(pods: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(groups, complete groups, partial groups) from the pods' gang keys and nodes."""
    members: dict[str, list[bool]] = {}
    for pod in pods:
        key = (pod["metadata"].get("annotations") or {}).get(tfa.GANG_GROUP_KEY)
        if key:
            members.setdefault(key, []).append(bool(pod["spec"].get("nodeName")))
    complete = sum(1 for bound in members.values() if all(bound))
    partial = sum(1 for bound in members.values() if any(bound) and not all(bound))
    return len(members), complete, partial


def worker_pod(i: int) -> dict[str, Any]:
    name = f"w-{i:05d}"
    return {"metadata": {"name": name, "namespace": "default",
                         "labels": {tfa.COMPONENT: "worker", tfa.WORKLOAD: name, tfa.GPU_POOL: POOL},
                         "annotations": {tfa.GPU_POOL: POOL, tfa.TFLOPS_REQUEST: POD_TFLOPS,
                                         tfa.TFLOPS_LIMIT: POD_TFLOPS, tfa.VRAM_REQUEST: POD_VRAM,
                                         tfa.VRAM_LIMIT: POD_VRAM, tfa.GPU_COUNT: "1", tfa.ISOLATION: "soft",
                                         tfa.QOS: "high"}},
            "spec": {"schedulerName": SCHEDULER,
                     "containers": [{"name": "main", "image": "app",
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}


async def wait_controller_ready(url: str, proc: subprocess.Popen[bytes], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    last = ""
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError("the controller exited")
            with contextlib.suppress(httpx.HTTPError):
                answer = await http.get("/readyz")
                if answer.status_code == 200:
                    return
                last = answer.text
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the controller did not become ready: {last}")


async def watch_binds(kube: KubeClient, bound_at: dict[str, float], total: int, done: asyncio.Event, *,
                      namespace: str | None = "default", prefix: str = "", relists: list[int] | None = None) -> None:
    """When each pod named `prefix…` in `namespace` (None: all) is first seen bound, until `total` are.
    A watch the API server expires (410: this process fell further behind than its watch history
    keeps, as can happen at 100,000 pods) is followed by a list, as a reflector does: a pod the list
    shows bound is counted as bound when the list saw it (later than it was: latencies err long).
    Each such list appends 1 to `relists`."""
    # one page for the list's resourceVersion: `kube.list` follows every page, which at 100,000
    # pods is hundreds of requests the API server serves while the pods are being scheduled
    pages = kube.list_pages(r.PODS, namespace=namespace, limit=1)
    rv = (await anext(pages)).resource_version
    await pages.aclose()

    def seen(pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if str(meta.get("name")).startswith(prefix) and (pod.get("spec") or {}).get("nodeName") and key not in bound_at:
            bound_at[key] = time.monotonic()

    expired = False
    while len(bound_at) < total:
        try:
            if expired:
                async for page in kube.list_pages(r.PODS, namespace=namespace, limit=500):
                    for pod in page.items:
                        seen(pod)
                    rv = page.resource_version
                expired = False
                if relists is not None:
                    relists.append(1)
            async for _, pod in kube.watch(r.PODS, namespace=namespace, resource_version=rv, timeout_seconds=60):
                rv = str((pod.get("metadata") or {}).get("resourceVersion") or rv)
                seen(pod)
                if len(bound_at) >= total:
                    break
        except Gone:
            expired = True
        except Exception:  # a broken stream or list: again from the last resourceVersion
            await asyncio.sleep(0.1)
    done.set()


async def wait_bound_or_stalled(done: asyncio.Event, bound_at: dict[str, float], timeout: float) -> None:
    """Until every pod is bound (`done`) or `timeout` seconds pass with no new bind."""
    seen = -1
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), timeout=timeout)
        except TimeoutError:
            if len(bound_at) == seen:
                return
            seen = len(bound_at)


def count_unowned_workloads(pods: list[dict[str, Any]], workloads: list[dict[str, Any]]) -> int:
    """Pods asking to own a workload (bare pods through the webhook) whose workload, once the run
    has settled, does not exist or is not controlled by that pod."""
    controllers = {w["metadata"]["name"]: [o.get("uid") for o in w["metadata"].get("ownerReferences") or []
                                           if o.get("controller")] for w in workloads}
    missing = 0
    for pod in pods:
        name = (pod["metadata"].get("annotations") or {}).get(tfa.PENDING_OWNED_WORKLOAD)
        if name and controllers.get(name) != [pod["metadata"]["uid"]]:
            missing += 1
    return missing


def count_double_allocations(pods: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> int:
    capacity = {g["metadata"]["name"]: (Quantity.parse(g["status"]["capacity"]["tflops"]).milli_value(),
                                        Quantity.parse(g["status"]["capacity"]["vram"]).value(),
                                        g["metadata"]["labels"][tfa.MANAGED_BY]) for g in gpus}
    used: dict[str, list[int]] = {}
    wrong_node = 0
    for pod in pods:
        notes = (pod["metadata"].get("annotations") or {})
        ids = notes.get(tfa.GPU_IDS)
        if not ids or not pod["spec"].get("nodeName"):
            continue
        t = Quantity.parse(notes[tfa.TFLOPS_REQUEST]).milli_value()
        v = Quantity.parse(notes[tfa.VRAM_REQUEST]).value()
        for gpu in ids.split(","):
            slot = used.setdefault(gpu, [0, 0])
            slot[0] += t
            slot[1] += v
            if capacity.get(gpu, (0, 0, ""))[2] != pod["spec"]["nodeName"]:
                wrong_node += 1
    over = sum(1 for gpu, (t, v) in used.items() if gpu not in capacity or t > capacity[gpu][0]
               or v > capacity[gpu][1])
    return over + wrong_node


async def webhook_service(kube: KubeClient, port: int) -> None:
    """The Service the controller registers its webhook under; the embedded API server sends the
    Service's port to 127.0.0.1:<targetPort>, the controller's webhook listener."""
    await kube.create(r.SERVICES, {"metadata": {"name": "tensor-fusion-webhook", "namespace": "tensor-fusion-sys"},
                                   "spec": {"ports": [{"port": 443, "targetPort": port}]}},
                      namespace="tensor-fusion-sys")


async def scheduler_attempts(controller_url: str) -> dict[str, int]:
    """The controller's scheduling attempts by result: more attempts than pods means pods were
    parked as unschedulable and tried again (a throughput figure alone hides that)."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{controller_url}/metrics")).text
    return {sample.labels["result"]: int(sample.value) for family in text_string_to_metric_families(text)
            if family.name == "tfusion_scheduler_attempts"
            for sample in family.samples if sample.name.endswith("_total")}


async def run(args: argparse.Namespace, kubeconfig: Path, controller_url: str,
              processes: dict[str, subprocess.Popen[bytes]], webhook_port: int) -> dict[str, Any]:
    controller = processes["controller"]
    kube = await KubeClient.connect(str(kubeconfig), namespace="default", qps=1e9, burst=10**9)
    try:
        await create_cluster(kube, args.nodes, args.gpus, args.clients)
        await wait_controller_ready(controller_url, controller)
        if args.webhook:
            await webhook_service(kube, webhook_port)
            # the webhook gives high/critical QoS pods these (the install and --role=all create them)
            classes = r.ApiResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
            for qos, value in (("critical", 100000), ("high", 10000), ("medium", 0)):
                await kube.create(classes, {"metadata": {"name": f"tensor-fusion-{qos}"}, "value": value})
        owners = await create_deployments(kube, args.deployments, args.pods) if args.owner == "deployment" else []
        await asyncio.sleep(1.0)  # let the leader's allocator see every GPU
        bound_at: dict[str, float] = {}
        created_at: dict[str, float] = {}
        done = asyncio.Event()
        watcher = asyncio.create_task(watch_binds(kube, bound_at, args.pods, done))
        await asyncio.sleep(0.2)
        server = raw_server(kubeconfig)
        counts_before = await request_counts(server)
        cpu_before = {name: cpu_seconds(proc) for name, proc in processes.items()}
        own_cpu_before = time.process_time()
        if args.profile:
            controller.send_signal(signal.SIGUSR1)
        first = time.monotonic()

        connections = [await apibench.Connection(server).open() for _ in range(args.clients)]
        numbers = iter(range(args.pods))
        groups = gang_groups(args.pods) if args.gangs else []

        def pod_for(i: int) -> dict[str, Any]:
            if args.gangs:
                return gang_member(i, groups)
            if owners:
                return owned_pod(i, owners[i % len(owners)])
            return webhook_pod(i) if args.webhook else worker_pod(i)

        async def creator(conn: Any) -> None:
            for i in numbers:
                status, body = await conn.request("POST", "/api/v1/namespaces/default/pods",
                                                  json.dumps(pod_for(i)).encode())
                if status != 201:
                    raise RuntimeError(f"pod create answered {status}: {body[:300]!r}")
                created_at[f"default/{json.loads(body)['metadata']['name']}"] = time.monotonic()

        await asyncio.gather(*(creator(c) for c in connections))
        for conn in connections:
            conn.close()
        created = time.monotonic()
        await wait_bound_or_stalled(done, bound_at, args.timeout)
        watcher.cancel()
        last = max(bound_at.values()) if bound_at else time.monotonic()
        counts_after = await settled_counts(server, args.settle)
        cpu_after = {name: cpu_seconds(proc) for name, proc in processes.items()}
        own_cpu = time.process_time() - own_cpu_before
        if args.profile:
            controller.send_signal(signal.SIGUSR2)
        latencies = sorted(max(0.0, bound_at[n] - created_at[n]) * 1000 for n in bound_at if n in created_at)
        pods = list(await kube.list(r.PODS, namespace="default"))
        gpus = list(await kube.list(r.GPUS))
        unscheduled = sum(1 for p in pods if not p["spec"].get("nodeName"))
        unowned = count_unowned_workloads(pods, list(await kube.list(r.TENSORFUSIONWORKLOADS, namespace="default")))
        gangs: dict[str, Any] = {}
        if args.gangs:
            total, complete, partial = gang_counts(pods)
            gangs = {"gangs": True, "group_sizes": list(GANG_SIZES), "groups": total, "complete_groups": complete,
                     "partial_gangs": partial, "groups_per_s": round(complete / max(1e-9, last - first), 1)}
        by_verb = per_pod(counts_before, counts_after, args.pods, reads=False)
        attempts = await scheduler_attempts(controller_url)
        return {
            "nodes": args.nodes, "gpus": args.gpus, "pods": args.pods, "clients": args.clients,
            "webhook": args.webhook, "owner": args.owner,
            **({"deployments": args.deployments} if owners else {}),
            "pods_per_s": round(len(bound_at) / max(1e-9, last - first), 1),
            "bind_p50_ms": round(statistics.median(latencies), 1) if latencies else None,
            "bind_p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 1)
            if latencies else None,
            "creates_per_s": round(args.pods / max(1e-9, created - first), 1),
            "unscheduled": unscheduled,
            "workloads_not_owned": unowned,
            "double_allocations": count_double_allocations(pods, gpus),
            "writes_per_pod": round(sum(by_verb.values()), 2),
            "writes_per_pod_by": by_verb,
            "reads_per_pod": round(sum(v for k, v in per_pod(counts_before, counts_after, args.pods, reads=True)
                                       .items() if not k.startswith("watch")), 2),
            **{f"{name}_cpu_ms_per_pod": round((cpu_after[name] - cpu_before[name]) * 1000 / args.pods, 3)
               for name in processes},
            "benchmark_cpu_ms_per_pod": round(own_cpu * 1000 / args.pods, 3),
            "scheduler_attempts": attempts,
            **gangs,
        }
    finally:
        await kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=4000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=30.0, help="give up after this long without a bind")
    parser.add_argument("--webhook", action=argparse.BooleanOptionalAction, default=True,
                        help="create the pods as users write them and let the controller's pod webhook mutate "
                             "them (default); --no-webhook creates them already mutated")
    parser.add_argument("--owner", choices=("none", "deployment"), default="none",
                        help="none: bare pods (default); deployment: pods of --deployments Deployments, created "
                             "with their ReplicaSet as controller (as the ReplicaSet controller creates them)")
    parser.add_argument("--deployments", type=int, default=10, help="with --owner deployment: how many")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="after the last bind, wait until no API write has come for this long before "
                             "counting writes and CPU")
    parser.add_argument("--profile", type=Path, help="write the controller's cProfile stats (pstats) of the "
                                                     "pod phase here")
    parser.add_argument("--gangs", action="store_true",
                        help="gang members in groups of 4 and 8 (implies --no-webhook); reports groups/s and "
                             "partial_gangs")
    args = parser.parse_args()
    if args.gangs:
        args.webhook = False
    if args.owner == "deployment" and (args.gangs or not args.webhook):
        parser.error("--owner deployment needs the webhook (it names the Deployment's workload); "
                     "not with --gangs or --no-webhook")
    if args.deployments < 1:
        parser.error(f"--deployments {args.deployments}: expected at least 1")
    with tempfile.TemporaryDirectory(prefix="tfusion-sched-bench-") as tmp:
        work = Path(tmp)
        kubeconfig = work / "kubeconfig"
        apiserver = start(["--role=apiserver", "--apiserver-listen", f"127.0.0.1:{free_port()}",
                           "--state", str(work / "state.db"), "--kubeconfig-out", str(kubeconfig),
                           "--watch-history", "200000"], work / "apiserver.log", TFUSION_BENCH_COUNT="1")
        controller: subprocess.Popen[bytes] | None = None
        try:
            wait_for(kubeconfig, apiserver, "the API server")
            port, webhook_port = free_port(), free_port()
            controller = start(["--role=controller", "--kube", str(kubeconfig), "--leader-elect=false",
                                "--controller-listen", f"127.0.0.1:{port}",
                                "--health-probe-bind-address", f"127.0.0.1:{free_port()}",
                                "--webhook-listen", f"127.0.0.1:{webhook_port}",
                                "--dynamic-config", str(work / "config.yaml")], work / "controller.log",
                               **({"TFUSION_BENCH_PROFILE": str(args.profile.resolve())} if args.profile else {}))
            result = asyncio.run(run(args, kubeconfig, f"http://127.0.0.1:{port}",
                                     {"controller": controller, "apiserver": apiserver}, webhook_port))
        except BaseException:
            for name in ("apiserver.log", "controller.log"):
                log = work / name
                if log.exists():
                    sys.stderr.write(f"--- {name} (tail)\n{log.read_text()[-3000:]}\n")
            raise
        finally:
            for proc in (controller, apiserver):
                if proc is not None:
                    stop(proc)
        print(json.dumps(result))
        failed = (result["unscheduled"] or result["double_allocations"] or result.get("partial_gangs")
                  or result["workloads_not_owned"])
        if failed:
            sys.stderr.write(f"FAILED: {result['unscheduled']} unscheduled, {result['double_allocations']} double "
                             f"allocation(s), {result.get('partial_gangs', 0)} partial gang(s), "
                             f"{result['workloads_not_owned']} bare pod(s) without their own workload\n")
            raise SystemExit(1)


if __name__ == "__main__":
    main()
