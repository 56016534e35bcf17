"""The pod webhook inside the controller: every replica serves it; one line in `configure()` adds it.

Why: this is where the pure mutation (mutate.py) meets the process — the shared informers it reads,
the leader's index and port allocators it asks (scheduling/assignments.py), the workload it writes,
the certificate it serves and the MutatingWebhookConfiguration it keeps current. `attach()` binds
`--webhook-listen` at once (a clash fails the start, and `:0` gives a known port: `address`), and
adds one task that loads the certificate, serves HTTPS, registers the webhook and then re-checks
certificate and registration every `check_interval` seconds (and at once when the dynamic config's
auto-migration switch changes the objectSelector).

A pod's review: operations other than a Pod CREATE are allowed untouched; so is a pod that is
not a TensorFusion pod. A pod identical to one already mutated, under the same cluster state, takes
the plan and the patch from the memo (memo.py) and goes straight to its index and workload; a
named pod without a controller is looked up by its shape, the pod under a placeholder name, and
gets the shape's patch with its own name written in (`_mutate_shared`). In
progressive-migration mode a native-GPU pod that auto-migration does not take gets only
`spec.schedulerName: tensor-fusion-scheduler`. Otherwise: owner chain, `analyse` (a Denial is
`allowed: false` with its code and message), the autoscaler's recommendation from the cached
workload, the grey-release counter, an index, a host port (not on dryRun), `render`, the workload
(not on dryRun), and the JSON patch. Failures of the API server or the leader are answered
`allowed: false` with code 500/503 and the reason, and logged; with `failurePolicy: Fail` the pod
is then not created.

Callers: with a client CA (`--webhook-client-ca`, or by default the embedded API server's own,
apiserver/webhooks.py) the TLS handshake requires a client certificate it signed, so only the API
server gets a review answered (the workload a review creates is a write; see workloads.py for what
undoes it when no pod follows). The CA file is re-read when it changes.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import orjson

from tfusion.api import annotations as tfa
from tfusion.api import shapes
from tfusion.api.accessors import Body, Gpu, Pod, section, text
from tfusion.api.documents import THREAD_THRESHOLD
from tfusion.api.jsontypes import JsonMapping, JsonObject
from tfusion.api.names import validate_name
from tfusion.controller.defaults import Denial, capacity_of_model
from tfusion.controller.scheduling.assignments import AssignmentError, Assignments
from tfusion.controller.webhook import mutate, remote, render
from tfusion.controller.webhook.certs import DirectoryCertificates, SecretCertificates, service_names
from tfusion.controller.webhook.memo import Key as MemoKey
from tfusion.controller.webhook.memo import Remembered, ReviewMemo, State, keeps
from tfusion.controller.webhook.mutate import Context, Owner
from tfusion.controller.webhook.patch import json_diff
from tfusion.controller.webhook.registration import (
    PATH,
    client_config,
    desired_configuration,
    ensure_registration,
)
from tfusion.controller.webhook.server import (
    AdmissionRequest,
    AdmissionResponse,
    allowed,
    checked_pod,
    denied,
    encode_patch,
    webhook_app,
)
from tfusion.controller.webhook.workloads import OwnerResolver, WorkloadWriter, apply_recommendation, short_id
from tfusion.errors import RoleError
from tfusion.kube import resources as r
from tfusion.kube.client import KubeError, NotFound
from tfusion.kube.informer import Informer, namespace_index
from tfusion.settings import format_listen, webhook_client_ca_path
from tfusion.web import HttpError, bind_socket, serve

if TYPE_CHECKING:
    from tfusion.controller.runtime import ControllerRuntime

log = logging.getLogger(__name__)

CONDITION = "webhook"
CHECK_INTERVAL_S = 600.0
SYNC_WAIT_S = 8.0
_NAMESPACE_INDEX = "webhook:namespace"
_MODEL_INDEX = "webhook:gpu-model"


def _gpu_model(obj: JsonMapping) -> list[str]:
    model = Gpu(obj).gpu_model
    return [model] if model else []


class WebhookService:
    """See the module docstring."""

    def __init__(self, runtime: ControllerRuntime, assignments: Assignments, *,
                 check_interval: float = CHECK_INTERVAL_S) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.check_interval = check_interval
        try:
            self.sock = bind_socket(self.settings.resolved_webhook_listen)
        except OSError as exc:
            raise RoleError(f"controller: --webhook-listen: {exc}") from None
        host, port = self.sock.getsockname()[:2]
        self.address: tuple[str, int] = (host, port)
        self.certs: SecretCertificates | DirectoryCertificates = self._certificates()
        self.client_ca = self._client_ca()
        self._client_ca_stamp: float | None = None
        client = runtime.client
        self.owners = OwnerResolver(client)
        self.workloads = WorkloadWriter(client, runtime.informer(r.TENSORFUSIONWORKLOADS))
        self.assignments = assignments
        self.namespaces: Informer = runtime.manager.cache.informer(r.NAMESPACES)
        self._changed = anyio.Event()
        self.registrations = 0
        self.reviews = 0
        self.memo = ReviewMemo()
        self._synced_once = False
        #: what `analyse` reads besides GPU capacities (see memo.State)
        self._read_informers = [runtime.informer(res) for res in (
            r.GPUPOOLS, r.PROVIDERCONFIGS, r.GPURESOURCEQUOTAS, r.WORKLOADPROFILES, r.SCHEDULINGCONFIGTEMPLATES)
        ] + [self.namespaces]
        self._gpus = runtime.informer(r.GPUS)
        #: the Context of each namespace, while the cluster is in `_contexts_state` (see `context`)
        self._contexts: dict[str, Context] = {}
        self._contexts_state: State | None = None

    @property
    def embedded(self) -> bool:
        """--role=all: the API server is in this process and calls the webhook on loopback."""
        return "all" in self.settings.roles

    def hosts(self) -> list[str]:
        names = service_names(self.settings.webhook_service, self.settings.operator_namespace)
        extra = list(self.settings.webhook_hosts)
        if self.embedded or self.address[0].startswith("127."):
            extra += ["localhost", "127.0.0.1"]
        elif self.address[0] not in ("0.0.0.0", "::"):
            extra.append(self.address[0])
        return list(dict.fromkeys(names + extra))

    def _certificates(self) -> SecretCertificates | DirectoryCertificates:
        if self.settings.webhook_cert_dir:
            return DirectoryCertificates(self.settings.webhook_cert_dir)
        return SecretCertificates(self.runtime.client, self.settings.operator_namespace, self.hosts())

    def _client_ca(self) -> Path | None:
        """The CA file whose client certificates may call (None: anyone may)."""
        value = self.settings.webhook_client_ca
        if value == "none":
            return None
        if value:
            return Path(value).expanduser()
        in_process = self.embedded or "apiserver" in self.settings.roles  # the embedded API server's CA
        return webhook_client_ca_path(self.settings.state) if in_process else None

    def _load_client_ca(self) -> None:
        """Require a client certificate signed by the CA file (loaded again when it changed)."""
        if self.client_ca is None:
            return
        try:
            stamp = os.stat(self.client_ca).st_mtime
        except OSError as exc:
            raise FileNotFoundError(f"--webhook-client-ca {self.client_ca}: {exc.strerror}") from None
        if stamp == self._client_ca_stamp:
            return
        context = self.certs.context
        try:
            context.load_verify_locations(cafile=str(self.client_ca))
        except ssl.SSLError as exc:
            raise ValueError(f"--webhook-client-ca {self.client_ca}: no PEM certificate in it ({exc})") from None
        context.verify_mode = ssl.CERT_REQUIRED
        self._client_ca_stamp = stamp
        log.info("pod webhook: callers need a client certificate signed by a CA in %s", self.client_ca)

    def url(self) -> str:
        host = self.address[0] if self.address[0] not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"https://{format_listen(host, self.address[1])}{PATH}"

    def attach(self) -> WebhookService:
        rt = self.runtime
        rt.informer(r.GPURESOURCEQUOTAS).add_index(_NAMESPACE_INDEX, namespace_index)
        rt.informer(r.GPUS).add_index(_MODEL_INDEX, _gpu_model)
        rt.dynamic_config.on_change(lambda config: self._changed.set())
        rt.tasks.append(self.run)
        rt.readiness.set(CONDITION, False, "loading the certificate")
        return self

    # --- serving and keeping current --------------------------------------------------------------------

    async def run(self) -> None:
        await self._until_certificate()
        factory: Any = lambda config, default: self.certs.context  # noqa: E731  uvicorn's ssl_context_factory
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: serve(webhook_app(self.review), self.sock,
                                                     uvicorn_options={"ssl_context_factory": factory},
                                                     task_status=task_status))
            log.info("pod webhook listening on %s", self.url())
            while True:
                await self._keep_current()
                with anyio.move_on_after(self.check_interval):
                    await self._changed.wait()
                self._changed = anyio.Event()

    async def _until_certificate(self) -> None:
        while True:
            try:
                await self._refresh_certificate()
                return
            except (KubeError, OSError, ValueError) as exc:
                log.warning("webhook certificate not ready: %s; retrying in 2 s", exc)
                self.runtime.readiness.set(CONDITION, False, f"certificate: {exc}")
            await anyio.sleep(2.0)

    async def _refresh_certificate(self) -> bool:
        self._load_client_ca()
        try:
            return await self.certs.refresh()
        except NotFound:  # the operator namespace is not there yet (a fresh embedded server)
            await self._ensure_namespace()
            return await self.certs.refresh()

    async def _ensure_namespace(self) -> None:
        from tfusion.kube.client import AlreadyExists

        try:
            await self.runtime.client.create(r.NAMESPACES, {"metadata": {"name": self.settings.operator_namespace}})
        except AlreadyExists:
            pass

    async def _keep_current(self) -> None:
        try:
            await self._refresh_certificate()
            await self.register()
            self.runtime.readiness.set(CONDITION, True, f"serving on {self.url()}")
        except (KubeError, OSError, ValueError) as exc:
            log.warning("webhook certificate or registration not current: %s", exc)
            self.runtime.readiness.set(CONDITION, False, f"not current: {exc}")

    async def register(self) -> str:
        """Create or update the MutatingWebhookConfiguration (also called by tests after a rotation)."""
        config = client_config(url=self.url() if self.embedded else None,
                               service=(self.settings.operator_namespace, self.settings.webhook_service),
                               ca_bundle=self.certs.ca_bundle)
        widened = self.settings.progressive_migration or mutate.auto_migration_enabled(
            self.runtime.dynamic_config.current.get("autoMigration"))
        outcome = await ensure_registration(self.runtime.client, desired_configuration(config, widened=widened),
                                            keep_ca_bundle=not self.certs.managed_ca)
        self.registrations += outcome != "unchanged"
        return outcome

    async def refresh(self) -> None:
        """Re-check certificate and registration now."""
        await self._refresh_certificate()
        await self.register()

    # --- one review ---------------------------------------------------------------------------------------

    async def review(self, request: AdmissionRequest) -> AdmissionResponse:
        self.reviews += 1
        if (request.operation != "CREATE" or request.resource.resource != "pods" or request.subResource
                or request.kind.kind not in ("Pod", "")):
            return allowed(request.uid)
        try:
            if len(request.object) > THREAD_THRESHOLD:  # a few MiB take a few hundred ms to read and check
                pod, problem = await anyio.to_thread.run_sync(_read_pod, request)
            else:
                decoded = _decoded(request)
                if decoded is not None and (answer := await self._mutate_shared(request, decoded)) is not None:
                    return answer
                pod, problem = _read_pod(request, decoded)
            if pod is None:
                return denied(request.uid, 400, "the AdmissionReview carries no pod object")
            if problem:  # kube-apiserver never sends such a pod; anyone else gets told what is wrong
                return denied(request.uid, 400, f"request.object is not a Pod: {problem}")
            return await self._mutate(request, pod)
        except Denial as exc:
            return denied(request.uid, exc.code, exc.message)
        except AssignmentError as exc:
            log.error("pod webhook: %s", exc.message)
            return denied(request.uid, exc.status, f"internal error: {exc.message}")
        except KubeError as exc:
            if exc.code in (400, 422):  # what the pod asked for makes a workload the API server refuses
                return denied(request.uid, 422, f"the TensorFusionWorkload this pod needs was refused: {exc}")
            log.error("pod webhook: API server failed: %s", exc)
            return denied(request.uid, 500, f"internal error: the API server failed: {exc}")

    async def _mutate(self, request: AdmissionRequest, pod: JsonObject) -> AdmissionResponse:
        meta = dict(section(pod, "metadata"))
        namespace = request.namespace or text(meta, "namespace") or "default"
        await self._synced()
        state = self._state()  # the state before reading the caches
        placed = {**pod, "metadata": {**meta, "namespace": namespace}}  # the pod in its namespace
        view = Pod(placed)
        key = (_memo_bytes(request, pod, meta), namespace)
        held = key in self.memo
        if (known := await self._remembered(key, state, view, namespace)) is not None:
            return await self._finish(request, pod, view, namespace, known.plan, (key, known))
        context = self.context(namespace, state)
        if not mutate.selects(view, context):
            return allowed(request.uid)
        if mutate.progressive_only(view, context):  # the patch is against the pod as sent (no namespace)
            return allowed(request.uid, encode_patch(json_diff(pod, mutate.progressive_pod(Pod(pod)))))
        owner = await self.owners.resolve(view, namespace)
        # the siblings of an owner's first pod wait for its owner walk above; the first one's plan
        # is in the memo by the time they go on, and no analysis is done again
        if not held and key in self.memo and (known := self._memo_answer(key, state, owner)) is not None:
            return await self._finish(request, pod, view, namespace, known.plan, (key, known))
        plan = mutate.analyse(view, context, owner)
        if plan is None:
            return allowed(request.uid)
        _check_workload_name(plan)
        recommendation = self.workloads.recommendation(plan.workload)
        if recommendation is not None:
            apply_recommendation(plan, recommendation)
        elif keeps(plan, owner, pod_named=bool(meta.get("name"))):
            entry = Remembered(state=state, owner=owner, plan=plan, gpu_reads=self._gpu_reads(plan))
            self.memo.remember(key, entry)
            return await self._finish(request, pod, view, namespace, plan, (key, entry))
        if plan.enabled_replicas is not None and not request.dryRun:
            counter = await self.owners.claim_grey_release(owner, namespace, _template_hash(view, plan),
                                                           plan.enabled_replicas)
            if counter is None:
                return allowed(request.uid)
            plan.annotations[tfa.POD_COUNTER_KEY] = counter
        return await self._finish(request, pod, view, namespace, plan, None)

    async def _mutate_shared(self, request: AdmissionRequest, pod: object) -> AdmissionResponse | None:
        """A named pod without a controller, analysed and rendered as its shape: the pod under
        SHAPE_NAME, whose plan and patch the memo shares with every pod that differs from it only
        in its name (the one thing a bare pod's plan reads of its name is its workload's name).
        `pod` is the object as decoded, not yet checked: a pod whose shape the memo holds was
        checked as that shape (its name is a string, the one difference), any other is checked here.
        None: the full path decides (not such a pod, a name the workload cannot take, a pod out of
        bounds, a denial, whose message names the pod, a plan the memo does not keep, a workload
        with a recommendation)."""
        if not isinstance(pod, dict) or not isinstance(meta := pod.get("metadata"), dict):
            return None
        name = _shared_name(request, meta)
        if not name or _workload_name_problem(name):
            return None
        namespace = request.namespace or text(meta, "namespace") or "default"
        shaped = {**pod, "metadata": {**meta, "name": SHAPE_NAME}}
        key = (_memo_bytes(request, shaped, shaped["metadata"], shaped=True), namespace)
        if (key not in self.memo or "managedFields" in meta) and not _sound(request, pod):
            return None
        await self._synced()
        state = self._state()  # the state before reading the caches
        view = Pod({**shaped, "metadata": {**meta, "name": SHAPE_NAME, "namespace": namespace}})
        entry = self.memo.get(key, state, Owner(workload_name=SHAPE_NAME), self._capacity) if key in self.memo \
            else None
        if entry is None:
            context = self.context(namespace, state)
            if not mutate.selects(view, context):
                return allowed(request.uid)
            if mutate.progressive_only(view, context):
                return None
            owner = await self.owners.resolve(view, namespace)
            try:
                plan = mutate.analyse(view, context, owner)
            except Denial:
                return None
            if plan is None:
                return allowed(request.uid)
            if not keeps(plan, owner, pod_named=True):
                return None
            entry = Remembered(state=state, owner=owner, plan=plan, gpu_reads=self._gpu_reads(plan))
            self.memo.remember(key, entry)
        if entry.named_workload is None or entry.named_workload[0] != name:
            entry.named_workload = (name, _renamed(entry.plan.workload, name))
        workload = entry.named_workload[1]
        if self.workloads.recommendation(workload) is not None:
            return None
        index = await self.assignments.assign_index(f"{namespace}/{name}")
        patch = entry.patches.get(index)  # the shape's patch as JSON text (SHAPE_NAME where the name goes)
        if patch is None:
            patch = self._patch_text(request, shaped, view, key, entry, index)
            self.memo.add_patch(key, entry, index, patch)
        if not request.dryRun:
            await self.workloads.ensure(workload, create=_creates_workload(entry.plan))
        return allowed(request.uid, base64.b64encode(patch.replace(SHAPE_NAME, name).encode()).decode())

    async def _remembered(self, key: MemoKey, state: State, view: Pod, namespace: str) -> Remembered | None:
        """The memo's answer for this pod, if it holds one that is still current."""
        if key not in self.memo:
            return None
        return self._memo_answer(key, state, await self.owners.resolve(view, namespace))

    def _memo_answer(self, key: MemoKey, state: State, owner: Owner) -> Remembered | None:
        found = self.memo.get(key, state, owner, self._capacity)
        if found is None or self.workloads.recommendation(found.plan.workload) is not None:
            return None
        return found

    async def _finish(self, request: AdmissionRequest, pod: JsonObject, view: Pod, namespace: str,
                      plan: mutate.Plan, remembered: tuple[MemoKey, Remembered] | None) -> AdmissionResponse:
        """Index, host port, the patch (the memo's for this index when it holds one; `remembered`:
        the plan is the memo's) and the workload."""
        pod_key = _assignment_key(view, namespace)
        # a remote client holds no GPU, so no index either (its workers get theirs)
        index = None if plan.remote is not None else await self.assignments.assign_index(pod_key)
        if remembered is not None and self.memo.holds(*remembered):
            patch = self._remembered_patch(request, pod, view, index, *remembered)
        else:  # a plan the memo does not keep, or a first sighting it only marked: nothing to share
            patch = await self._rendered(request, pod, view, plan, index, pod_key)
        if not request.dryRun:
            await self.workloads.ensure(plan.workload, create=_creates_workload(plan))
        return allowed(request.uid, patch)

    def _remembered_patch(self, request: AdmissionRequest, pod: JsonObject, view: Pod, index: int | None,
                          key: MemoKey, entry: Remembered) -> str:
        """The kept memo entry's base64 patch for this index, made once (`_patch_text`)."""
        patch = entry.patches.get(index)
        if patch is None:
            patch = base64.b64encode(self._patch_text(request, pod, view, key, entry, index).encode()).decode()
            self.memo.add_patch(key, entry, index, patch)
        return patch

    def _patch_text(self, request: AdmissionRequest, sent: JsonObject, view: Pod, key: MemoKey, entry: Remembered,
                    index: int | None) -> str:
        """The memo entry's JSON patch for `index` as text: its patch for any index with this one
        written in, where the memo keeps the entry and that serves; else rendered (a plan the memo
        keeps takes no host port). `sent`: the pod the patch is against, `view` it as analysed."""
        template = self._any_index(request, sent, view, key, entry) \
            if index is not None and self.memo.holds(key, entry) else None
        if template is not None and index is not None:
            return render.with_index(template, index)
        return _patch_json(sent, view, entry.plan, index)

    async def _rendered(self, request: AdmissionRequest, pod: JsonObject, view: Pod, plan: mutate.Plan,
                        index: int | None, pod_key: str) -> str:
        """The pod rendered with its index (and a host port, if the plan wants one): the base64 patch."""
        port = None
        if plan.host_port is not None and not request.dryRun:
            port = await self.assignments.assign_host_port(pod_key)
        return encode_patch(json_diff(pod, render.render(view, plan, index=index, host_port=port)))

    def _any_index(self, request: AdmissionRequest, sent: JsonObject, view: Pod, key: MemoKey,
                   entry: Remembered) -> str | None:
        """The entry's patch for every index, as JSON text rendered with render.ANY_INDEX
        (`render.with_index` writes an index in): rendered once, kept with the entry. None where
        each index is rendered of its own (render.renders_any_index). `sent`: the pod the patch is
        against, `view` it as analysed."""
        found = entry.patches.get(render.ANY_INDEX)
        if found is None and render.renders_any_index(entry.plan, bytes(request.object)):
            found = _patch_json(sent, view, entry.plan, render.ANY_INDEX)
            self.memo.add_patch(key, entry, render.ANY_INDEX, found)
        return found

    def _state(self) -> State:
        return State(tuple(i.generation for i in self._read_informers), self.runtime.dynamic_config.current)

    async def _synced(self) -> None:
        if self._synced_once:  # an informer stays synced once it has listed (a relist replaces in place)
            return
        informers = [self.runtime.informer(res) for res in (r.GPUPOOLS, r.PROVIDERCONFIGS, r.GPURESOURCEQUOTAS,
                                                            r.WORKLOADPROFILES, r.TENSORFUSIONWORKLOADS)]
        with anyio.move_on_after(SYNC_WAIT_S):
            for informer in informers:
                await informer.wait_synced()
            self._synced_once = True
            return
        raise AssignmentError(503, "the webhook's caches have not synced with the API server yet; retry")

    def _capacity(self, model: str) -> JsonMapping | None:
        """The capacity of a GPU of this model in the cache (the first one that has one)."""
        return capacity_of_model(self._gpus.by_index(_MODEL_INDEX, model), model)

    def _gpu_reads(self, plan: mutate.Plan) -> dict[str, object]:
        """The GPU capacity the analysis read, for the memo to compare again (read again here, right
        after the analysis and before anything awaits, so it is what the analysis saw)."""
        model = plan.capacity_model
        return {model: self._capacity(model)} if model else {}

    def context(self, namespace: str, state: State) -> Context:
        """What `analyse` reads, from the caches, as they are in `state`. One Context serves every
        pod of a namespace until an informer it reads changes or the dynamic config is reloaded
        (the memo's rule, memo.State): what it derives from the objects (the default pool, the
        ProviderConfig of a vendor, the quota that applies) is then worked out once per change, not
        once per pod. GPU capacities are looked up live."""
        if self._contexts_state is None or not self._contexts_state.holds(state):
            self._contexts, self._contexts_state = {}, state
        found = self._contexts.get(namespace)
        if found is None:
            found = self._contexts[namespace] = self._new_context(namespace)
        return found

    def _new_context(self, namespace: str) -> Context:
        rt = self.runtime
        auto = rt.dynamic_config.current.get("autoMigration")
        profiles = rt.informer(r.WORKLOADPROFILES)
        ns_labels: Mapping[str, str] = {}
        if mutate.auto_migration_enabled(auto):
            found = self.namespaces.get(namespace)
            ns_labels = Body(found).meta.labels if found is not None else {}
        return Context(pools=rt.informer(r.GPUPOOLS).list(), provider_configs=rt.informer(r.PROVIDERCONFIGS).list(),
                       quotas=rt.informer(r.GPURESOURCEQUOTAS).by_index(_NAMESPACE_INDEX, namespace),
                       profile=lambda name: profiles.get(f"{namespace}/{name}"), gpu_capacity=self._capacity,
                       templates=rt.informer(r.SCHEDULINGCONFIGTEMPLATES).list(),
                       auto_migration=auto if isinstance(auto, Mapping) else None, namespace_labels=ns_labels,
                       progressive=self.settings.progressive_migration,
                       limiter_image=self.settings.limiter_image,
                       operator_endpoint=remote.operator_endpoint(self.settings))


#: the JSON types of the pod fields the mutation reads, as the API server checks them on a write
_POD_SHAPE = shapes.KIND_SHAPES["/pods"]


def _read_pod(request: AdmissionRequest, decoded: object = None) -> tuple[JsonObject | None, str]:
    """The pod (None: there is none) and the first field of the wrong type ("" when none is);
    `decoded`: the object as `_decoded` gave it (None: decode it here)."""
    pod = request.pod() if decoded is None else checked_pod(decoded, bytes(request.object))
    return pod, "" if pod is None else shapes.mismatch(_POD_SHAPE, pod)


def _decoded(request: AdmissionRequest) -> object:
    """The object decoded, not yet checked; None when it is not JSON (`request.pod()` says why)."""
    try:
        return orjson.loads(memoryview(request.object)) if request.object else None
    except orjson.JSONDecodeError:
        return None


def _sound(request: AdmissionRequest, pod: JsonObject) -> bool:
    """Whether `_read_pod` takes this pod, decoded from the request (within bounds, fields of the
    right types)."""
    try:
        checked_pod(pod, bytes(request.object))
    except HttpError:
        return False
    return not shapes.mismatch(_POD_SHAPE, pod)
_WORKLOADS_STORAGE = f"{r.TENSORFUSIONWORKLOADS.group}/{r.TENSORFUSIONWORKLOADS.plural}"


def _creates_workload(plan: mutate.Plan) -> bool:
    """Whether admission creates the pod's workload when there is none: not for a bare local pod,
    whose workload the pod reconciler creates once the pod exists, owned by it from the start (one
    write, none of them on the pod's way to its node). A workload that exists is brought up to date
    here all the same (a pod created again under its name)."""
    return tfa.PENDING_OWNED_WORKLOAD_SPEC not in plan.annotations


def _check_workload_name(plan: mutate.Plan) -> None:
    """The workload is named after the pod or its owner: a name the API server would refuse (a pod
    named `a.`) is the pod's fault, said before anything is written."""
    name = Body(plan.workload).name
    for field, _, message in validate_name(_WORKLOADS_STORAGE, name):
        raise Denial(f"{field}: {message} (the TensorFusionWorkload is named after the pod, or its owner)",
                     code=422)


#: the name a shared pod is analysed and rendered under (see `_mutate_shared`): a valid name, and
#: one no pod, quota or pool can hold by chance (random for each process)
SHAPE_NAME = f"tfusion-shape-{secrets.token_hex(8)}"
_SHAPE_BYTES = SHAPE_NAME.encode()


def _shared_name(request: AdmissionRequest, meta: JsonMapping) -> str:
    """The pod's name when it is shared by shape: named, without a controller (an owned pod is
    keyed as sent, its workload named after the owner), and not holding SHAPE_NAME anywhere."""
    name = meta.get("name")
    if not name or not isinstance(name, str):
        return ""
    if meta.get("ownerReferences") and Body({"metadata": meta}).meta.controller_ref() is not None:
        return ""
    return "" if _SHAPE_BYTES in bytes(request.object) else name


def _workload_name_problem(name: str) -> bool:
    return any(True for _ in validate_name(_WORKLOADS_STORAGE, name))


def _renamed(workload: JsonObject, name: str) -> JsonObject:
    """The shape's workload for the pod named `name` (SHAPE_NAME is its name and nothing else)."""
    return {**workload, "metadata": {**section(workload, "metadata"), "name": name}}


def _patch_json(sent: JsonObject, view: Pod, plan: mutate.Plan, index: int | None) -> str:
    """The JSON patch, as text, from `sent` to the pod `view` rendered with `index` (no host port)."""
    return orjson.dumps(json_diff(sent, render.render(view, plan, index=index, host_port=None))).decode()


def _memo_bytes(request: AdmissionRequest, pod: JsonObject, meta: JsonMapping, *, shaped: bool = False) -> bytes:
    """The pod as sent, but for `metadata.managedFields`: kube-apiserver stamps those before
    admission with the time to the second, so a Deployment's replicas differ only there; the
    mutation neither reads nor changes them. (Key order is the sender's, so equal pods give equal
    bytes.) `shaped`: `pod` is not the one sent but its shape."""
    if "managedFields" not in meta:
        return orjson.dumps(pod) if shaped else bytes(request.object)
    return orjson.dumps({**pod, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}})


def _assignment_key(pod: Pod, namespace: str) -> str:
    name = pod.name or f"{text(pod.meta.raw, 'generateName') or 'pod-'}{short_id()}"
    return f"{namespace}/{name}"


def _template_hash(pod: Pod, plan: mutate.Plan) -> str:
    labels = pod.meta.labels
    return (labels.get("pod-template-hash") or labels.get("controller-revision-hash")
            or plan.labels[tfa.POD_TEMPLATE_HASH])


def attach_webhook(runtime: ControllerRuntime, assignments: Assignments) -> WebhookService | None:
    """The webhook, which takes indexes and host ports from `assignments` (unless ENABLE_WEBHOOKS=false)."""
    if not runtime.settings.enable_webhooks:
        log.info("ENABLE_WEBHOOKS=false: the pod webhook is neither served nor registered")
        return None
    return WebhookService(runtime, assignments).attach()
