"""The simulated cloud (the original calls it `mock`): instances are ConfigMaps in the operator
namespace, so one machine can play a cluster that grows and shrinks without any cloud account.

Why ConfigMaps: the controller may not import the embedded stage (import-linter), and the records
must outlive a restart of `--role=all` as cloud VMs do. The provider only writes the records; the
node farm of `--role=all` (`tfusion/embedded/node_farm.py`) watches them and, once `bootAt` has
passed, registers the Node with a simulated kubelet and reports its simulated GPUs. Deleting the
record is terminating the instance: the farm stops the node and deletes it.

A record: name = instance id (`sim-<10 hex>`, derived from the claim, so a retried create after a
crash finds its own record even between the lookup and the create), labels
`tensor-fusion.ai/simulated-instance=true` and `tensor-fusion.ai/node-provisioner=<claim>`, and
string data (see `SimulatedInstance`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import orjson

from tfusion.api import annotations as tfa
from tfusion.api.accessors import Body
from tfusion.api.jsontypes import JsonMapping
from tfusion.api.quantity import Quantity, QuantityError
from tfusion.controller.provisioning.catalog import CAPACITY_TYPES, Catalog, InstanceType
from tfusion.controller.provisioning.providers.base import Instance, LaunchRequest, ProviderError
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, KubeError, NotFound

log = logging.getLogger(__name__)
T = TypeVar("T")

#: label on every instance record (value "true"); the node farm watches records with it
SIMULATED_INSTANCE = "tensor-fusion.ai/simulated-instance"
#: the zone of an instance whose claim names none and whose type lists none
DEFAULT_ZONE = "simulated-zone-a"


class SimulatedInstanceError(ValueError):
    """An instance record that cannot be read; the message names the record, the field and the value."""


@dataclass(frozen=True)
class SimulatedInstance:
    """One instance record, parsed."""

    instance_id: str
    claim: str
    instance_type: str
    node_name: str
    gpu_model: str
    gpu_count: int
    cpu: str  # a quantity, as the Node's allocatable cpu
    memory: str  # a quantity, as the Node's allocatable memory
    capacity_type: str
    zone: str
    launched_at: float  # epoch seconds
    boot_at: float  # epoch seconds: the node registers from then on
    node_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def device_spec(self) -> str:
        """The simulated devices of the node, as `--devices` names them."""
        return f"sim:{self.gpu_count}x{self.gpu_model}"

    def state(self, now: float) -> str:
        return "running" if now >= self.boot_at else "pending"

    def instance(self, now: float) -> Instance:
        return Instance(instance_id=self.instance_id, claim=self.claim, instance_type=self.instance_type,
                        node_name=self.node_name, state=self.state(now), capacity_type=self.capacity_type,
                        zone=self.zone, launched_at=self.launched_at)


def simulated_instance(configmap: JsonMapping) -> SimulatedInstance:
    """Parse an instance record; SimulatedInstanceError names the field that is wrong."""
    body = Body(configmap)
    raw = configmap.get("data")
    data: Mapping[str, object] = raw if isinstance(raw, Mapping) else {}
    where = f"simulated instance {body.namespace}/{body.name}"

    def text(key: str) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value:
            raise SimulatedInstanceError(f"{where}: data.{key} is {value!r}; expected a non-empty string")
        return value

    def number(key: str) -> float:
        value = text(key)
        try:
            return float(value)
        except ValueError:
            raise SimulatedInstanceError(f"{where}: data.{key} is {value!r}; expected epoch seconds") from None

    def quantity(key: str) -> str:
        value = text(key)
        try:
            Quantity.parse(value)
        except QuantityError:
            raise SimulatedInstanceError(f"{where}: data.{key} is {value!r}; expected a quantity") from None
        return value

    count = text("gpuCount")
    if not count.isdigit() or int(count) < 1:
        raise SimulatedInstanceError(f"{where}: data.gpuCount is {count!r}; expected a positive integer")
    try:
        labels = orjson.loads(text("nodeLabels"))
    except orjson.JSONDecodeError:
        labels = None
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise SimulatedInstanceError(f"{where}: data.nodeLabels is {data.get('nodeLabels')!r}; "
                                     "expected a JSON object of strings")
    return SimulatedInstance(
        instance_id=body.name, claim=body.meta.label(tfa.NODE_PROVISIONER) or "",
        instance_type=text("instanceType"), node_name=text("nodeName"), gpu_model=text("gpuModel"),
        gpu_count=int(count), cpu=quantity("cpu"), memory=quantity("memory"),
        capacity_type=text("capacityType"), zone=text("zone"), launched_at=number("launchedAt"),
        boot_at=number("bootAt"), node_labels=labels)


def instance_id_for(claim: str) -> str:
    return "sim-" + hashlib.sha256(claim.encode()).hexdigest()[:10]


class SimulatedProvider:
    """`CloudProvider` over instance records (see the module docstring). `boot_delay_s`: seconds
    from launch to the Node registering (`--simulated-boot-delay`); `wall`: epoch seconds."""

    name = "simulated"

    def __init__(self, client: KubeClient, namespace: str, catalog: Catalog, *, boot_delay_s: float,
                 wall: Callable[[], float] = time.time) -> None:
        if boot_delay_s < 0:
            raise ValueError(f"simulated boot delay: {boot_delay_s!r} is not allowed; expected seconds >= 0")
        self.client = client
        self.namespace = namespace
        self._catalog = catalog
        self.boot_delay_s = boot_delay_s
        self.wall = wall

    def catalog(self) -> Catalog:
        return self._catalog

    async def create(self, request: LaunchRequest) -> Instance:
        kind = self._sold(request)
        existing = await self._records(f"{tfa.NODE_PROVISIONER}={request.claim}")
        if existing:
            return existing[0].instance(self.wall())
        record = self._record(request, kind)
        try:
            created = await _kube(self.client.create(r.CONFIGMAPS, record, namespace=self.namespace))
        except AlreadyExists:
            created = await _kube(self.client.get(r.CONFIGMAPS, instance_id_for(request.claim),
                                                  namespace=self.namespace))
        return self._parse(created).instance(self.wall())

    async def terminate(self, instance_id: str) -> None:
        try:
            await _kube(self.client.delete(r.CONFIGMAPS, instance_id, namespace=self.namespace))
        except NotFound:
            pass

    async def list_instances(self) -> list[Instance]:
        now = self.wall()
        return [found.instance(now) for found in await self._records()]

    # --- helpers ------------------------------------------------------------------------------------

    def _sold(self, request: LaunchRequest) -> InstanceType:
        """The catalog's entry for the request's type; ProviderError(retryable=False) names what is wrong."""
        name = request.instance_type.name
        kind = self._catalog.get(name)
        if kind is None:
            raise ProviderError(f"instanceType {name!r} is not in the simulated provider's catalog; "
                                f"allowed: {', '.join(self._catalog.names())}", retryable=False)
        if request.capacity_type not in CAPACITY_TYPES or kind.price(request.capacity_type) is None:
            sold = [c for c in CAPACITY_TYPES if kind.price(c) is not None]
            raise ProviderError(f"capacityType {request.capacity_type!r} is not sold for {name}; "
                                f"allowed: {', '.join(sold)}", retryable=False)
        if request.zone and kind.zones and request.zone not in kind.zones:
            raise ProviderError(f"zone {request.zone!r} does not offer {name}; allowed: {', '.join(kind.zones)}",
                                retryable=False)
        if not request.node_name:
            raise ProviderError(f"claim {request.claim}: nodeName is empty; expected the Node's name",
                                retryable=False)
        return kind

    def _record(self, request: LaunchRequest, kind: InstanceType) -> dict[str, object]:
        launched = self.wall()
        labels = {**request.labels, tfa.NODE_PROVISIONER: request.claim}
        data = {
            "instanceType": kind.name, "nodeName": request.node_name, "gpuModel": kind.gpu_model,
            "gpuCount": str(kind.gpu_count), "cpu": str(Quantity.from_milli(kind.cpu_milli)),
            "memory": str(Quantity.from_int(kind.memory_bytes, "BinarySI")),
            "capacityType": request.capacity_type,
            "zone": request.zone or (kind.zones[0] if kind.zones else DEFAULT_ZONE),
            "launchedAt": repr(launched), "bootAt": repr(launched + self.boot_delay_s),
            "nodeLabels": orjson.dumps(labels, option=orjson.OPT_SORT_KEYS).decode(),
        }
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": instance_id_for(request.claim), "namespace": self.namespace,
                             "labels": {SIMULATED_INSTANCE: "true", tfa.NODE_PROVISIONER: request.claim}},
                "data": data}

    async def _records(self, selector: str = "") -> list[SimulatedInstance]:
        """The readable records (a hand-edited, unreadable one is logged and skipped: it boots no node)."""
        wanted = ",".join(s for s in (f"{SIMULATED_INSTANCE}=true", selector) if s)
        found = await _kube(self.client.list(r.CONFIGMAPS, namespace=self.namespace, label_selector=wanted))
        records = []
        for item in found:
            try:
                records.append(simulated_instance(item))
            except SimulatedInstanceError as exc:
                log.warning("%s; ignoring it", exc)
        return sorted(records, key=lambda i: i.instance_id)

    @staticmethod
    def _parse(configmap: JsonMapping) -> SimulatedInstance:
        try:
            return simulated_instance(configmap)
        except SimulatedInstanceError as exc:
            raise ProviderError(str(exc), retryable=False) from None



async def _kube(call: Awaitable[T]) -> T:
    """A call to the API server; failures other than 404/409 become retryable ProviderErrors."""
    try:
        return await call
    except (NotFound, AlreadyExists):
        raise
    except KubeError as exc:
        raise ProviderError(f"simulated provider: the API server refused: {exc}") from exc
