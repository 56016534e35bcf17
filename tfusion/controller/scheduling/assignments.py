"""The leader's index and host-port allocators on the controller, and how other replicas reach them.

Why: the webhook runs on every replica, but a pod index and a cluster host port must come from one
place, the leader. `Assignments` keeps an `IndexAllocator` and a `PortAllocator` while this replica
leads (rebuilt from the pod cache each term, occupied as pods appear, released with the pod's GPUs
by `AllocatorService.release`), answers `assign_index` / `assign_host_port` locally when leading,
and otherwise asks the leader over HTTP:

- `GET /api/assign-index?podName=` -> `text/plain` index (1..128)
- `POST /api/assign-host-port?podName=` -> `text/plain` port

Both need `Authorization: Bearer <token>` where the token passes a TokenReview and belongs to the
controller's own ServiceAccount (401 otherwise). A replica that does not lead yet waits up to
`leader_wait` seconds for leadership, then answers 503. Followers find the leader through the
ConfigMap `tensor-fusion-operator-leader-info` (`leader-ip`) and the controller port.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from litestar import MediaType, Request, Response, get, post
from litestar.enums import ParamType
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIType, Operation, Schema
from litestar.openapi.spec import Parameter as OpenAPIParameter

from tfusion.api.accessors import Pod, text
from tfusion.api.jsontypes import JsonMapping
from tfusion.controller.scheduling.indexes import IndexAllocator, pod_index
from tfusion.controller.scheduling.ports import NoFreePort, PortAllocator
from tfusion.kube import resources as r
from tfusion.kube.auth import TokenReviewer, Unauthenticated, authenticate, unverified_claims
from tfusion.kube.client import KubeError
from tfusion.kube.leader import LEADER_INFO_CONFIGMAP, LEADER_IP_KEY
from tfusion.kube.pacing import paced
from tfusion.settings import format_listen, parse_listen

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
#: the ServiceAccount assumed when the controller runs without one (outside a cluster)
DEFAULT_SERVICE_ACCOUNT = "tensor-fusion-operator"
LEADER_WAIT_S = 5.0
REMOTE_TIMEOUT_S = 8.0


class AssignmentError(Exception):
    """No index or port could be had; `status` is the HTTP status that says why (503, 500, …)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _jwt_subject(token: str) -> str:
    """The `sub` claim of our own token (read unverified: it names us, it authorizes nothing)."""
    claims = unverified_claims(token)
    return str(claims.get("sub") or "") if claims is not None else ""


def read_token(path: Path = SERVICE_ACCOUNT_TOKEN) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def own_username(namespace: str, path: Path = SERVICE_ACCOUNT_TOKEN) -> str:
    """`system:serviceaccount:<ns>:<sa>` of this controller: from its mounted token, else the default."""
    return _jwt_subject(read_token(path)) or f"system:serviceaccount:{namespace}:{DEFAULT_SERVICE_ACCOUNT}"


class Assignments:
    """See the module docstring. `attach()` once, in `configure()`."""

    def __init__(self, runtime: ControllerRuntime, *, leader_wait: float = LEADER_WAIT_S) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.leader_wait = leader_wait
        self.indexes: IndexAllocator | None = None
        self.ports: PortAllocator | None = None
        self._building: tuple[IndexAllocator, PortAllocator] | None = None
        self.reviewer = TokenReviewer(runtime.manager.client) if runtime.manager.has_client else None
        self.own_username = own_username(self.settings.operator_namespace)
        #: the bearer token sent to the leader (the mounted ServiceAccount token, re-read each call)
        self.token_source: Callable[[], str] = read_token
        #: how a follower finds the leader's base URL; tests may point it elsewhere
        self.leader_address: Callable[[], Awaitable[str]] = self._leader_from_configmap
        self.terms = 0

    def attach(self) -> Assignments:
        rt = self.runtime
        # occupation only: a pod's index and port are released with its GPUs (AllocatorService.release)
        rt.informer(r.PODS).add_handler(on_add=self._on_pod, on_update=self._on_pod_update)
        rt.add_leader_task(self.run_leader)
        rt.routes.extend(assignment_handlers(self))
        return self

    # --- leader state ---------------------------------------------------------------------------------

    async def run_leader(self) -> None:
        informer = self.runtime.informer(r.PODS)
        await informer.wait_synced()
        indexes = IndexAllocator()
        ports = PortAllocator(self.settings.cluster_host_port_range, self.settings.host_port_range)
        # paced (kube/pacing.py): the pod events and releases meanwhile go to the allocators being
        # built, and each pod is read here as the cache has it when its turn comes
        self._building = (indexes, ports)
        try:
            async for key in paced(informer.keys()):
                raw = informer.get(key)
                if raw is not None:
                    self._observe(indexes, ports, Pod(raw))
        finally:
            self._building = None
        self.indexes, self.ports = indexes, ports
        self.terms += 1
        log.info("index and port allocators rebuilt: %d indices, %d cluster ports held", len(indexes.held()),
                 len(ports.cluster.held()))
        try:
            await anyio.sleep_forever()
        finally:
            self.indexes = self.ports = None

    @staticmethod
    def _observe(indexes: IndexAllocator, ports: PortAllocator, pod: Pod) -> None:
        uid = pod.uid
        if not uid or pod.finished or pod.meta.deleting:
            return  # holds nothing any more (released by the pod reconciler, or never occupied this term)
        index = pod_index(pod)
        if index is not None:
            indexes.occupy(uid, index, f"{pod.namespace}/{pod.name}")
        ports.observe(uid, pod)

    def _held(self) -> tuple[IndexAllocator, PortAllocator] | None:
        """The allocators pods occupy and release: the live ones, or those the term's start builds."""
        if self.indexes is not None and self.ports is not None:
            return self.indexes, self.ports
        return self._building

    def _on_pod(self, raw: JsonMapping) -> None:
        held = self._held()
        if held is not None:
            self._observe(*held, Pod(raw))

    def _on_pod_update(self, _old: object, new: JsonMapping) -> None:
        self._on_pod(new)

    async def release_pod(self, uid: str) -> None:
        """The release hook of `AllocatorService.release`: a pod's index and host port go with its
        GPUs, before its finalizer is removed (idempotent: a second call finds nothing held)."""
        self._release(uid)

    def _release(self, uid: str) -> None:
        held = self._held()
        if held is not None and uid:
            held[0].release(uid)
            held[1].release(uid)

    async def _leading(self, wait: float) -> bool:
        """True once this replica's allocators are up; False when another replica leads or `wait` ran out."""
        if self.indexes is not None:
            return True
        with anyio.move_on_after(wait):
            while True:
                if self.indexes is not None:
                    return True
                elector = self.runtime.manager.elector
                holder = getattr(elector, "observed_holder", "") if elector is not None else ""
                if holder and holder != self.runtime.identity:
                    return False
                await anyio.sleep(0.02)
        return self.indexes is not None

    # --- what the webhook calls -----------------------------------------------------------------------

    async def assign_index(self, key: str) -> int:
        if await self._leading(self.leader_wait) and self.indexes is not None:
            return self.indexes.assign(key)
        return int(await self._ask_leader("GET", "/api/assign-index", key))

    async def assign_host_port(self, key: str) -> int:
        if await self._leading(self.leader_wait) and self.ports is not None:
            try:
                return self.ports.cluster.assign(key)
            except NoFreePort as exc:
                raise AssignmentError(500, str(exc)) from None
        return int(await self._ask_leader("POST", "/api/assign-host-port", key))

    async def _ask_leader(self, method: str, path: str, key: str) -> str:
        token = self.token_source()
        if not token:
            raise AssignmentError(503, "this controller replica does not lead and has no ServiceAccount token "
                                       "to ask the leader with")
        try:
            base = await self.leader_address()
            async with httpx.AsyncClient(base_url=base, timeout=REMOTE_TIMEOUT_S, trust_env=False) as http:
                response = await http.request(method, path, params={"podName": key},
                                              headers={"Authorization": f"Bearer {token}"})
        except (httpx.HTTPError, KubeError, LookupError) as exc:
            raise AssignmentError(503, f"cannot reach the leader for {path}: {exc}") from None
        if response.status_code != 200 or not response.text.strip().isdigit():
            raise AssignmentError(503 if response.status_code >= 500 else 500,
                                  f"the leader answered {path} with {response.status_code}: {response.text[:200]}")
        return response.text.strip()

    async def _leader_from_configmap(self) -> str:
        config = await self.runtime.client.get(r.CONFIGMAPS, LEADER_INFO_CONFIGMAP,
                                               namespace=self.settings.operator_namespace)
        ip = text(config, "data", LEADER_IP_KEY)
        if not ip:
            raise LookupError(f"ConfigMap {LEADER_INFO_CONFIGMAP} has no {LEADER_IP_KEY}")
        port = parse_listen(self.settings.resolved_controller_listen)[1]
        return "http://" + format_listen(ip, port)

    # --- the routes -----------------------------------------------------------------------------------

    async def authorize(self, header: str | None) -> None:
        """A token of the controller's own ServiceAccount, or the 401/503 `kube.auth` words."""
        try:
            reviewed = await authenticate(self.reviewer, header)
            if reviewed.username != self.own_username:
                raise Unauthenticated(f"the token of {reviewed.username} is not the controller's ServiceAccount "
                                      f"{self.own_username}")
        except Unauthenticated as exc:
            raise AssignmentError(exc.status, exc.message) from None

    async def answer(self, request: Request[Any, Any, Any], kind: str) -> Response[str]:
        try:
            await self.authorize(request.headers.get("authorization"))
            pod_name = request.query_params.get("podName") or ""
            if not pod_name:
                raise AssignmentError(400, "query parameter podName is required")
            if not await self._leading(self.leader_wait) or self.indexes is None or self.ports is None:
                raise AssignmentError(503, "this controller replica is not the leader; ask the one named in "
                                           f"ConfigMap {LEADER_INFO_CONFIGMAP}")
            value = self.indexes.assign(pod_name) if kind == "index" else self.ports.cluster.assign(pod_name)
        except AssignmentError as exc:
            return Response(exc.message, status_code=exc.status, media_type=MediaType.TEXT)
        except NoFreePort as exc:  # the range is used up: not a bug, and it may free up again
            return Response(str(exc), status_code=503, media_type=MediaType.TEXT)
        return Response(str(value), media_type=MediaType.TEXT)


async def _as_is(response: Response[Any]) -> Response[Any]:
    """These routes answer text/plain, errors included (the original's clients read text), so the
    app's turn-every-error-into-JSON hook is replaced on them."""
    return response


#: these routes answer text/plain even for errors (the original's clients read the body as text)
_TEXT_ERRORS = {
    status: ResponseSpec(str, media_type=MediaType.TEXT, description=text, generate_examples=False)
    for status, text in ((400, "podName missing or not a pod of this cluster"),
                         (401, "no token, or not the controller's own ServiceAccount"),
                         (500, "a bug"), (503, "no leader answered in time, or no free port left"))}


@dataclass
class _PodNameOperation(Operation):
    """Documents `podName` as a required query parameter. The handler reads it itself, after the
    token check, as the original does (a declared parameter would be checked before the token)."""

    def __post_init__(self) -> None:
        self.parameters = [*(self.parameters or []), OpenAPIParameter(
            name="podName", param_in=ParamType.QUERY, required=True, description="the pod's name",
            schema=Schema(type=OpenAPIType.STRING, min_length=1))]


def assignment_handlers(service: Assignments) -> list[Any]:
    @get("/api/assign-index", media_type=MediaType.TEXT, summary="A pod index (1..128) from the leader",
         after_request=_as_is, responses=_TEXT_ERRORS, operation_class=_PodNameOperation)
    async def assign_index(request: Request[Any, Any, Any]) -> Response[str]:
        return await service.answer(request, "index")

    @post("/api/assign-host-port", media_type=MediaType.TEXT, status_code=200,
          summary="A cluster-level host port from the leader", request_max_body_size=1024, after_request=_as_is,
          responses=_TEXT_ERRORS, operation_class=_PodNameOperation)
    async def assign_host_port(request: Request[Any, Any, Any]) -> Response[str]:
        return await service.answer(request, "port")

    return [assign_index, assign_host_port]
