"""The Endpoints controller of `--role=all`: a Service with a selector lists its pods' addresses.

Why it exists: clients that look a Service up (service meshes, `kubectl describe svc`, tools that
wait for a Service to have endpoints) read core/v1 Endpoints or discovery.k8s.io/v1
EndpointSlices, which kube-controller-manager writes. Here one small level-triggered controller
writes both for each Service with a selector: the selected pods that have a `status.podIP`, ready
ones under `addresses`, the others under `notReadyAddresses` (pods without an IP are skipped), and
the Service's ports resolved to the pods' container ports. A Service that loses its selector or
goes away loses the objects this controller wrote. Leader-only, as in kube-controller-manager.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tfusion.api.accessors import Body, Pod, items, section
from tfusion.api.jsontypes import JsonMapping, JsonObject, JsonValue
from tfusion.embedded.workloads.common import is_ready
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.informer import Informer
from tfusion.kube.manager import Manager
from tfusion.kube.reconciler import Result
from tfusion.kube.resources import ApiResource

ENDPOINTS = ApiResource("", "v1", "endpoints", "Endpoints", True)
ENDPOINTSLICES = ApiResource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True)
SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
MANAGER = "endpointslice-controller.tfusion.dev"


def selects(selector: Mapping[str, Any], pod: Body) -> bool:
    labels = pod.meta.labels
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _target_port(port: Mapping[str, Any], pod: Pod) -> int | None:
    """The Service port's targetPort on `pod`: a number, or a container port's name (None: not on it)."""
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    for container in items(pod.raw, "spec", "containers"):
        for declared in items(container, "ports"):
            if declared.get("name") == target and isinstance(declared.get("containerPort"), int):
                return int(declared["containerPort"])
    return None


def endpoint_ports(service: Body, pod: Pod) -> list[JsonObject]:
    out: list[JsonObject] = []
    for port in items(service.spec, "ports"):
        number = _target_port(port, pod)
        if number is not None:
            entry: JsonObject = {"port": number, "protocol": str(port.get("protocol", "TCP"))}
            if port.get("name"):
                entry["name"] = str(port["name"])
            out.append(entry)
    return out


def _address(pod: Pod) -> JsonObject:
    address: JsonObject = {"ip": pod.pod_ip, "targetRef": {
        "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}}
    node = str(section(pod.raw, "spec").get("nodeName") or "")
    if node:
        address["nodeName"] = node
    return address


def endpoints_body(service: Body, pods: list[Pod]) -> JsonObject:
    """core/v1 Endpoints: one subset per distinct port list, as kube groups them."""
    subsets: dict[str, JsonObject] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        ports = endpoint_ports(service, pod)
        subset = subsets.setdefault(repr(ports), {"ports": list(ports)})
        bucket = "addresses" if is_ready(pod) else "notReadyAddresses"
        addresses = subset.setdefault(bucket, [])
        assert isinstance(addresses, list)
        addresses.append(_address(pod))
    meta: JsonObject = {"name": service.name, "namespace": service.namespace,
                        "labels": dict(service.meta.labels)}
    return {"apiVersion": "v1", "kind": "Endpoints", "metadata": meta, "subsets": list(subsets.values())}


def slice_body(service: Body, pods: list[Pod]) -> JsonObject:
    """discovery.k8s.io/v1 EndpointSlice named after the Service (one slice: the simulated node is small)."""
    endpoints: list[JsonValue] = []
    for pod in sorted(pods, key=lambda p: p.name):
        address = _address(pod)
        ready = is_ready(pod)
        endpoint: JsonObject = {"addresses": [pod.pod_ip], "targetRef": address["targetRef"],
                                "conditions": {"ready": ready, "serving": ready, "terminating": False}}
        if "nodeName" in address:
            endpoint["nodeName"] = address["nodeName"]
        endpoints.append(endpoint)
    ports = endpoint_ports(service, pods[0]) if pods else []
    labels: JsonObject = {**service.meta.labels, SERVICE_NAME: service.name, MANAGED_BY: MANAGER}
    meta: JsonObject = {"name": service.name, "namespace": service.namespace, "labels": labels}
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta,
            "addressType": "IPv4", "endpoints": endpoints, "ports": list(ports)}


class EndpointsController:
    """Registers itself with `manager`: Services drive it, pod changes requeue the Services selecting them."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        cache = manager.cache
        self.services: Informer = cache.informer(r.SERVICES)
        self.pods: Informer = cache.informer(r.PODS)
        manager.controller("endpoints").for_(r.SERVICES).watches(r.PODS, self._services_of).complete(self.reconcile)

    def _services_of(self, pod: JsonMapping) -> Iterator[str]:
        body = Body(pod)
        for raw in self.services.list():
            service = Body(raw)
            if service.namespace == body.namespace and selects(section(service.spec, "selector"), body):
                yield f"{service.namespace}/{service.name}"

    def _pods_for(self, service: Body) -> list[Pod]:
        selector = section(service.spec, "selector")
        return [pod for pod in map(Pod, self.pods.list())
                if pod.namespace == service.namespace and selects(selector, pod) and pod.pod_ip
                and not pod.meta.deleting and not pod.finished]

    async def reconcile(self, key: str) -> Result | None:
        namespace, _, name = key.rpartition("/")
        raw = self.services.get(key)
        client = self.manager.client
        if raw is None or not section(Body(raw).spec, "selector"):
            for resource in (ENDPOINTS, ENDPOINTSLICES):
                await _remove(client, resource, namespace, name)
            return None
        service = Body(raw)
        pods = self._pods_for(service)
        await _upsert(client, ENDPOINTS, endpoints_body(service, pods), ("subsets",))
        await _upsert(client, ENDPOINTSLICES, slice_body(service, pods), ("endpoints", "ports"))
        return None


async def _remove(client: KubeClient, resource: ApiResource, namespace: str, name: str) -> None:
    try:
        current = await client.get(resource, name, namespace=namespace)
    except NotFound:
        return
    labels = section(current, "metadata", "labels")
    if resource is ENDPOINTSLICES and labels.get(MANAGED_BY) != MANAGER:
        return  # a slice someone else wrote
    try:
        await client.delete(resource, name, namespace=namespace)
    except NotFound:
        pass


async def _upsert(client: KubeClient, resource: ApiResource, wanted: JsonObject, fields: tuple[str, ...]) -> None:
    """Create `wanted`, or replace the stored one when `fields` or its labels differ (a conflict requeues)."""
    meta = section(wanted, "metadata")
    name, namespace = str(meta["name"]), str(meta["namespace"])
    try:
        current = await client.get(resource, name, namespace=namespace)
    except NotFound:
        await client.create(resource, wanted, namespace=namespace)
        return
    same = all(current.get(f) == wanted.get(f) for f in fields)
    if same and section(current, "metadata", "labels") == meta.get("labels"):
        return
    replacement = {**current, **{f: wanted.get(f) for f in fields}}
    replacement["metadata"] = {**current["metadata"], "labels": meta.get("labels")}
    await client.replace(resource, replacement, namespace=namespace)  # a 409 is retried with backoff
