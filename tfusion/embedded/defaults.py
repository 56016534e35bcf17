"""The objects a fresh embedded installation starts with, created once and then left to the user.

Like the original's Helm chart: the operator namespace, the SchedulingConfigTemplate
`tf-scheduling-config`, the TensorFusionCluster `tensor-fusion` with its default pool and the
PriorityClasses `tensor-fusion-{medium,high,critical}` (defaults.yaml). The cluster's GPUPools
(`<cluster>-<pool>`, the default one annotated `<domain>/is-default-pool=true`, owned by the
cluster) are created here too, by the TensorFusionCluster reconciler's own `pools_of_cluster`, so
that a fresh install has its default pool before the controller leads; from then on the
reconciler keeps them.

Each default is created only if it was never created before: a ConfigMap in the operator namespace
records what was, so a restart on the same state neither overwrites what the user edited nor
brings back what the user deleted. An object that already exists is never touched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import resources as package_files

import yaml

from tfusion.api.accessors import Body, text
from tfusion.api.jsontypes import JsonMapping, JsonObject, json_object
from tfusion.controller.reconcilers.cluster import pools_of_cluster
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, KubeError, NotFound
from tfusion.settings import Settings, parse_listen

log = logging.getLogger(__name__)

#: the ConfigMap (operator namespace) listing the defaults created so far, one "Kind/name" a line
RECORD_NAME = "tfusion-embedded-defaults"
CLUSTER_NAME = "tensor-fusion"
DEFAULT_POOL_NAME = "tensor-fusion-shared"
PRIORITYCLASSES = r.ApiResource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)

_RESOURCES = {res.kind: res for res in (*r.TF_RESOURCES, PRIORITYCLASSES)}


class DefaultsError(RuntimeError):
    """A default object could not be created; the message names it and the server's reason."""


@dataclass
class DefaultsReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    left_deleted: list[str] = field(default_factory=list)

    def describe(self) -> str:
        text = f"{len(self.created)} created, {len(self.existing)} already there"
        if self.left_deleted:
            text += f", {len(self.left_deleted)} deleted by the user and left deleted"
        return text


def default_objects(settings: Settings) -> list[JsonObject]:
    """defaults.yaml, with the pool's operator endpoint pointed at this machine's controller."""
    text = package_files.files("tfusion.embedded").joinpath("defaults.yaml").read_text()
    objects = [doc for doc in yaml.safe_load_all(text) if doc]  # our own file: its shape is known
    for obj in objects:
        if obj["kind"] == "TensorFusionCluster":
            for pool in obj["spec"].get("gpuPools") or []:
                client = pool["specTemplate"].setdefault("componentConfig", {}).setdefault("client", {})
                client["operatorEndpoint"] = controller_endpoint(settings)
    return [json_object(obj) for obj in objects]


def controller_endpoint(settings: Settings) -> str:
    host, port = parse_listen(settings.controller_listen)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port or 8080}"


def _key(obj: Body) -> str:
    return f"{obj.kind}/{obj.name}"


async def ensure_namespace(client: KubeClient, name: str) -> bool:
    """Create the namespace when missing; True when it was created."""
    try:
        await client.get(r.NAMESPACES, name)
        return False
    except NotFound:
        pass
    try:
        await client.create(r.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except AlreadyExists:
        return False
    return True


class _Record:
    """Which defaults were created before (the ConfigMap RECORD_NAME)."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.keys: set[str] = set()
        self.exists = False

    async def load(self) -> None:
        try:
            found = await self.client.get(r.CONFIGMAPS, RECORD_NAME, namespace=self.namespace)
        except NotFound:
            return
        self.exists = True
        self.keys = {line for line in text(found, "data", "created").splitlines() if line}

    async def save(self) -> None:
        data = {"created": "\n".join(sorted(self.keys)) + "\n"}
        if self.exists:
            await self.client.patch(r.CONFIGMAPS, RECORD_NAME, {"data": data}, namespace=self.namespace)
            return
        await self.client.create(r.CONFIGMAPS, {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": RECORD_NAME, "namespace": self.namespace,
                         "annotations": {"description": "defaults tfusion --role=all created once; "
                                                        "listed ones are never created again"}},
            "data": data}, namespace=self.namespace)
        self.exists = True


async def create_defaults(client: KubeClient, settings: Settings) -> DefaultsReport:
    """Create every default that was never created before (see the module docstring)."""
    report = DefaultsReport()
    namespace = settings.operator_namespace
    if await ensure_namespace(client, namespace):
        report.created.append(f"Namespace/{namespace}")
    record = _Record(client, namespace)
    await record.load()
    for obj in default_objects(settings):
        created = await _create_once(client, obj, record, report)
        if Body(obj).kind == "TensorFusionCluster":
            cluster = created or await _get(client, Body(obj))
            for pool in pools_of_cluster(cluster) if cluster else ():
                await _create_once(client, pool, record, report)
    await record.save()
    return report


async def _get(client: KubeClient, obj: Body) -> Body | None:
    """The object of `obj`'s kind and name as the server has it (None when it has none)."""
    try:
        return Body(await client.get(_RESOURCES[obj.kind], obj.name))
    except NotFound:
        return None


async def _create_once(client: KubeClient, document: JsonMapping, record: _Record,
                       report: DefaultsReport) -> Body | None:
    """Create `document` unless it was created before; returns the created object (None otherwise)."""
    obj = Body(document)
    key = _key(obj)
    if key in record.keys:
        if await _get(client, obj) is None:
            report.left_deleted.append(key)
        else:
            report.existing.append(key)
        return None
    try:
        created = Body(await client.create(_RESOURCES[obj.kind], document))
    except AlreadyExists:
        report.existing.append(key)  # the user's own object of that name: theirs, untouched
        record.keys.add(key)
        return None
    except KubeError as exc:
        raise DefaultsError(f"creating default {key}: {exc}") from None
    log.info("created default %s", key)
    report.created.append(key)
    record.keys.add(key)
    return created
