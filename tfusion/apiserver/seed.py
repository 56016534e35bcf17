"""What the embedded API server gives its store at every start: the system namespaces and priority
classes kube-apiserver creates for itself, the stored CRDs' kinds registered again, and a repair of
rows an older version stored under the wrong scope. Separate from objects.py, which is the
per-request object semantics.
"""

from __future__ import annotations

import logging
import uuid

from tfusion.api.timestamps import rfc3339
from tfusion.apiserver import customresources
from tfusion.apiserver.conversion import adopt_separate_event_rows
from tfusion.apiserver.kinds import CRDS, NAMESPACES, PRIORITY_CLASSES, SYSTEM_PRIORITY_CLASSES
from tfusion.apiserver.objects import Engine

log = logging.getLogger(__name__)
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "tensor-fusion-sys")


def bootstrap(engine: Engine) -> None:
    """The system namespaces (with their default ServiceAccounts) and priority classes when missing,
    the stored CRDs' kinds registered, events an earlier version stored apart moved into the core
    event store (conversion.py), then `repair_scopes`."""
    info = engine.registry.get("", "v1", "namespaces")
    assert info is not None
    for name in SYSTEM_NAMESPACES:
        if engine.store.get(NAMESPACES, "", name) is None:
            obj = {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {
                    "name": name,
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": rfc3339(),
                    "labels": {"kubernetes.io/metadata.name": name},
                },
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }
            engine.store.put(NAMESPACES, obj, None)
            engine.kinds.default_service_account(name)
    for name, value in SYSTEM_PRIORITY_CLASSES.items():
        if engine.store.get(PRIORITY_CLASSES, "", name) is None:
            engine.store.put(
                PRIORITY_CLASSES,
                {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": rfc3339()},
                    "value": value,
                    "preemptionPolicy": "PreemptLowerPriority",
                    "description": "Used for system critical pods that must not be moved from their current node.",
                },
                None,
            )
    for _, entry in engine.store.items(CRDS):
        customresources.register(engine.registry, entry.obj)
    adopt_separate_event_rows(engine.store)
    repair_scopes(engine)


def repair_scopes(engine: Engine) -> None:
    """Remove the rows an older version could store under a namespace for a cluster-scoped object
    (a write that set metadata.namespace made a second, hidden copy, e.g. of a ClusterRoleBinding).

    Runs once CRDs are registered, so custom cluster-scoped kinds are known. The cluster-scoped row,
    the one every read and delete uses, is kept; each removed row is logged.
    """
    for storage_key in engine.store.storage_keys():
        if not engine.registry.cluster_scoped(storage_key):
            continue
        for (ns, name), entry in engine.store.items(storage_key):
            if ns:
                log.warning(
                    "removing a stored %s %r under namespace %r (uid %s): the resource is cluster-scoped, "
                    "so this row was a hidden copy left by an earlier version",
                    storage_key, name, ns, entry.obj.get("metadata", {}).get("uid"),
                )
                engine.store.purge(storage_key, (ns, name))
