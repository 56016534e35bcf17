"""Binding a reserved pod: the annotations and the Binding in one write, then the commit.

Why one write: the Binding subresource carries annotations of its own, which the API server
copies onto the pod in the same update that sets `spec.nodeName` (kube-apiserver does so too).
So a pod is never bound without its `gpu-ids`, nor annotated with GPUs it does not hold; that is
what makes a crash at any moment safe. The allocation goes through three states:

1. reserved (assumed) in the leader's memory by the scheduling cycle;
2. bound: the Binding succeeded. From here on the pod's annotations are the truth: a restarted
   leader rebuilds the allocation from `gpu-ids` (AllocatorService recovery), so nothing leaks
   and nothing is counted twice;
3. committed in memory (PreBind), and the GPU and quota statuses flushed.

A failure before 2 rolls the reservation back (Unreserve). An answer that does not say whether
the Binding happened (a timeout, a 5xx) is settled by reading the pod: bound to our node with
our `gpu-ids` means it happened. A 409 (bound by someone else, deleted, another UID) rolls back;
if another process bound it with GPUs, the AllocatorService adopts that allocation from the
pod's annotations.

Annotations written (reference §2.4): `gpu-ids` (comma list), `container-gpus` (JSON container ->
GPU ids, for the containers in `inject-container`, else the first container, sorted by name, the
GPUs split in order by `container-gpu-count` when given, else every GPU to each container),
`effective-hard-sm-percent` (hard isolation with an absolute TFLOPS limit:
ceil(limit / capacity x 100), 1..100), and `index`: the pod index its containers ask the device
plugin for (`<domain>/index_<k>` limit, written by the webhook), which the device plugin maps an
Allocate back to the pod by.

The node-level index lock: the allocator holds each pod's index on its node for as long as the
allocation lives (tfusion/allocator/indexlock.py) and Reserve refuses a node where another pod
holds it, so the filter steers such a pod elsewhere. Just before the Binding, `index_conflict`
checks the lock once more (a pod bound meanwhile by another process and adopted from its
annotations may hold the index now): a conflict is not bound; the caller rolls the reservation
back and retries the pod later with that reason. So two pods bound to one node never carry the
same index, and `index` is written only when the node-level index is the pod's alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import orjson

from tfusion.allocator import AllocRequest, GpuAllocator
from tfusion.api import annotations as tfa
from tfusion.api.annotations import AnnotationError
from tfusion.kube import resources as r
from tfusion.kube.client import Conflict, KubeClient, KubeError, NotFound, TokenBucket

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def injected_containers(pod: Obj) -> list[str]:
    """The containers that get GPUs: `inject-container` (comma list), else the first container."""
    notes = _meta(pod).get("annotations") or {}
    named = [c.strip() for c in str(notes.get(tfa.INJECT_CONTAINER) or "").split(",") if c.strip()]
    if named:
        return sorted(set(named))
    containers = (pod.get("spec") or {}).get("containers") or []
    first = containers[0].get("name") if containers and isinstance(containers[0], Mapping) else None
    return [str(first)] if first else []


def container_gpus(pod: Obj, gpus: Sequence[str]) -> dict[str, list[str]]:
    """Container -> GPU ids: split in order by `container-gpu-count`, else every GPU to each."""
    containers = injected_containers(pod)
    notes = _meta(pod).get("annotations") or {}
    counts: dict[str, int] = {}
    raw = notes.get(tfa.CONTAINER_GPU_COUNT)
    if raw:
        try:
            counts = tfa.parse_container_gpu_count(str(raw), key=tfa.CONTAINER_GPU_COUNT)
        except AnnotationError as exc:
            log.warning("pod %s/%s: %s; giving every GPU to each container", _meta(pod).get("namespace"),
                        _meta(pod).get("name"), exc)
            counts = {}
    if not counts or sum(counts.get(c, 0) for c in containers) != len(gpus):
        return {c: list(gpus) for c in containers}
    out: dict[str, list[str]] = {}
    at = 0
    for container in containers:
        n = counts.get(container, 0)
        out[container] = list(gpus[at:at + n])
        at += n
    return out


def effective_hard_sm_percent(req: AllocRequest, capacity_milli: int) -> int | None:
    """For hard isolation with an absolute TFLOPS limit: the SM share that limit is of the GPU."""
    if req.isolation != tfa.ISOLATION_HARD or not req.tflops_limit or capacity_milli <= 0:
        return None
    return max(1, min(100, math.ceil(req.tflops_limit * 100 / capacity_milli)))


def bind_annotations(pod: Obj, req: AllocRequest | None, gpus: Sequence[str],
                     allocator: GpuAllocator | None) -> dict[str, str]:
    """What the Binding writes on the pod (nothing for a pod without GPUs)."""
    if req is None or not gpus:
        return {}
    notes = {tfa.GPU_IDS: ",".join(gpus)}
    per_container = container_gpus(pod, gpus)
    if per_container:
        notes[tfa.CONTAINER_GPUS] = json.dumps(per_container, sort_keys=True, separators=(",", ":"))
    capacity = 0
    if allocator is not None:
        try:
            capacity = allocator.gpu_info(gpus[0]).capacity_tflops
        except KeyError:
            capacity = 0
    percent = effective_hard_sm_percent(req, capacity)
    if percent is not None:
        notes[tfa.EFFECTIVE_HARD_SM_PERCENT] = str(percent)
    if req.pod_index:
        notes[tfa.INDEX] = str(req.pod_index)
    return notes


def index_conflict(req: AllocRequest | None, node: str, allocator: GpuAllocator | None) -> str:
    """Why the pod must not be bound to `node` now: another pod holds its pod index there ("" when
    it may be bound: no index, or the node-level lock is the pod's alone)."""
    if req is None or not req.pod_index or allocator is None:
        return ""
    busy = allocator.index_conflict(req, node)
    return f"not bound: {busy}; the reservation is rolled back and the pod retried" if busy else ""


def binding_body(pod: Obj, node: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    meta = _meta(pod)
    metadata: dict[str, Any] = {"name": meta.get("name"), "namespace": meta.get("namespace"),
                                "uid": meta.get("uid")}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


@dataclass(frozen=True, slots=True)
class BindResult:
    """`bound`: the pod is on the node with our annotations; `error`: why not (empty when bound)."""

    bound: bool
    error: str = ""
    #: a 409: the pod was bound elsewhere, deleted or replaced; retrying this pod is pointless
    conflict: bool = False


class LeanPoster:
    """Keep-alive HTTP/1.1 connections for the Binding POSTs alone.

    Why: a Binding is one small POST, but through kr8s and httpx it costs about 1 ms of the
    leader's CPU, a third of a scheduling cycle's whole cost at hundreds of pods per second. This
    writes the request on a kept-alive connection and reads a Content-Length or chunked answer,
    with the kr8s connection's server, bearer token and TLS settings. It is used only when the
    connection authenticates with a bearer token; anything it does not understand (a 401, a
    closed connection, an odd answer) is left to the client, which does it the ordinary way.
    """

    def __init__(self, host: str, port: int, prefix: str, tls: ssl.SSLContext | None, token: str, *,
                 qps: float = 1000.0, burst: int = 2000) -> None:
        self.host, self.port, self.prefix, self.tls = host, port, prefix, tls
        self.limiter = TokenBucket(qps, burst)
        self._auth = f"Authorization: Bearer {token}\r\n"
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        #: Bindings answered on this path, and those handed to the ordinary client
        self.posted = 0
        self.handed_over = 0

    @classmethod
    async def for_client(cls, client: KubeClient, *, qps: float = 1000.0, burst: int = 2000) -> LeanPoster | None:
        auth = getattr(client.api, "auth", None)
        token = getattr(auth, "token", None)
        server = getattr(auth, "server", "")
        if auth is None or not token or not server:
            return None
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            return None
        tls: ssl.SSLContext | None = None
        if url.scheme == "https":
            verify = await auth.ssl_context()
            tls = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
        port = url.port or (443 if url.scheme == "https" else 80)
        return cls(url.hostname, port, url.path.rstrip("/"), tls, str(token), qps=qps, burst=burst)

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port, ssl=self.tls,
                                             server_hostname=self.host if self.tls else None)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        await self.limiter.acquire()
        reader, writer = await self._connection()
        try:
            head = (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}\r\n{self._auth}"
                    f"Content-Type: application/json\r\nAccept: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n")
            writer.write(head.encode() + body)
            with anyio.fail_after(30):
                status, answer, keep = await _read_response(reader)
        except BaseException:
            writer.close()
            raise
        if keep:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return status, answer


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    status_line = await reader.readline()
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ConnectionError(f"not an HTTP/1.1 answer: {status_line[:100]!r}")
    status = int(parts[1])
    length: int | None = None
    chunked, keep = False, parts[0] == b"HTTP/1.1"
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif name == b"connection":
            keep = value != b"close"
        elif name == b"content-encoding" and value not in (b"identity", b""):
            raise ConnectionError(f"unexpected content encoding {value!r}")
    if chunked:
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return status, bytes(body), keep
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    if length is None:
        return status, await reader.read(), False
    return status, await reader.readexactly(length), keep


async def _post_lean(poster: LeanPoster, pod: Obj, node: str, annotations: Mapping[str, str]) -> BindResult | None:
    """The Binding on the lean path; None when the ordinary client should do it."""
    meta = _meta(pod)
    path = f"/api/v1/namespaces/{meta.get('namespace') or 'default'}/pods/{meta.get('name')}/binding"
    try:
        status, answer = await poster.post(path, orjson.dumps(binding_body(pod, node, annotations)))
    except (OSError, ConnectionError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
        log.debug("lean Binding POST failed (%s); the client does it", exc)
        poster.handed_over += 1
        return None
    if status not in (200, 201, 404, 409):
        poster.handed_over += 1
        return None  # 401 (a token to refresh), 429, 5xx …: the client's own handling
    poster.posted += 1
    if status in (200, 201):
        return BindResult(True)
    if status == 404:
        return BindResult(False, "the pod was deleted before it could be bound", conflict=True)
    return BindResult(False, f"binding refused: 409 {_status_message(answer)}", conflict=True)


def _status_message(answer: bytes) -> str:
    try:
        return str(orjson.loads(answer).get("message") or "")
    except (orjson.JSONDecodeError, AttributeError):
        return answer[:200].decode(errors="replace")


async def post_binding(client: KubeClient, pod: Obj, node: str, annotations: Mapping[str, str],
                       poster: LeanPoster | None = None) -> BindResult:
    """POST pods/<name>/binding (on `poster` when given); an ambiguous failure is settled by
    reading the pod back."""
    meta = _meta(pod)
    name, namespace = str(meta.get("name")), str(meta.get("namespace") or "default")
    if poster is not None:
        lean = await _post_lean(poster, pod, node, annotations)
        if lean is not None:
            return lean
        current = await _read_back(client, pod)
        if current is not None and _bound_as_asked(current, pod, node, annotations):
            return BindResult(True)  # the lean POST got through before its answer was lost
        if current is not None and (current.get("spec") or {}).get("nodeName"):
            return BindResult(False, "binding refused: the pod is already bound", conflict=True)
    try:
        await client.request("POST", r.PODS, path=f"{name}/binding", namespace=namespace,
                             body=binding_body(pod, node, annotations))
        return BindResult(True)
    except Conflict as exc:
        return BindResult(False, f"binding refused: {exc}", conflict=True)
    except NotFound:
        return BindResult(False, "the pod was deleted before it could be bound", conflict=True)
    except KubeError as exc:
        failure = str(exc)
    try:
        current = await client.get(r.PODS, name, namespace=namespace)
    except KubeError as exc:
        return BindResult(False, f"binding failed ({failure}) and the pod cannot be read back: {exc}")
    if _bound_as_asked(current, pod, node, annotations):
        return BindResult(True)
    return BindResult(False, f"binding failed: {failure}")


async def _read_back(client: KubeClient, pod: Obj) -> Obj | None:
    meta = _meta(pod)
    try:
        return await client.get(r.PODS, str(meta.get("name")), namespace=str(meta.get("namespace") or "default"))
    except KubeError:
        return None


def _bound_as_asked(current: Obj, pod: Obj, node: str, annotations: Mapping[str, str]) -> bool:
    if _meta(current).get("uid") != _meta(pod).get("uid"):
        return False
    if (current.get("spec") or {}).get("nodeName") != node:
        return False
    notes = _meta(current).get("annotations") or {}
    return all(notes.get(k) == v for k, v in annotations.items())
