"""Endpoints that are not plain object storage: pods/binding, pods/eviction, serviceaccounts/token, tokenreviews.

They are POST-only, kube-apiserver answers them with a Status (binding, eviction) or with the
request object filled in (TokenRequest, TokenReview), and the token ones delegate signing and
checking to tokens.TokenAuthority.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tfusion.api.timestamps import rfc3339
from tfusion.apiserver import errors, netpolicy, shapes, validation
from tfusion.apiserver.asgi import Request, Target
from tfusion.apiserver.budgets import budget_status, scale_from
from tfusion.apiserver.objects import PODS, Engine
from tfusion.apiserver.tokens import TokenAuthority

Handler = Callable[[Request, Target], Awaitable[tuple[int, Any]]]

_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
#: kube-apiserver raises shorter TokenRequest lifetimes to this minimum
MIN_TOKEN_SECONDS = 600
#: and refuses longer ones than this
MAX_TOKEN_SECONDS = 2**32
#: where the controllers whose scale a budget counts are stored, by kind (budgets.py)
_SCALED = {"Deployment": "apps/deployments", "ReplicaSet": "apps/replicasets", "StatefulSet": "apps/statefulsets"}


class Services:
    def __init__(self, engine: Engine, authority: Callable[[], TokenAuthority]) -> None:
        self.engine = engine
        self._make_authority = authority
        self._authority: TokenAuthority | None = None

    @property
    def authority(self) -> TokenAuthority:
        if self._authority is None:
            self._authority = self._make_authority()
        return self._authority

    def handlers(self) -> dict[tuple[str, str], Handler]:
        return {
            (PODS, "binding"): self.bind,
            (PODS, "eviction"): self.evict,
            ("/serviceaccounts", "token"): self.token_request,
            ("authentication.k8s.io/tokenreviews", "create"): self.token_review,
        }

    def _pod_info(self) -> Any:
        info = self.engine.registry.get("", "v1", "pods")
        assert info is not None
        return info

    async def bind(self, request: Request, target: Target) -> tuple[int, Any]:
        body = request.json()
        shapes.check_body(shapes.BINDING, "Binding", "v1", body)
        node = (body.get("target") or {}).get("name")
        if not node:
            raise errors.invalid("Binding", "", target.name, [validation.required("target.name")])
        info = self._pod_info()
        ns = target.namespace or ""
        pod = self.engine.get(info, ns, target.name)
        expected_uid = (body.get("metadata") or {}).get("uid")
        if expected_uid and expected_uid != pod.obj["metadata"].get("uid"):
            raise errors.conflict("pods", "", target.name, "the UID in the binding does not match the pod")
        current = (pod.obj.get("spec") or {}).get("nodeName")
        if current:
            raise errors.conflict(
                "pods/binding", "", target.name, f'pod {target.name} is already assigned to node "{current}"'
            )
        if pod.obj["metadata"].get("deletionTimestamp"):
            raise errors.conflict(
                "pods/binding", "", target.name, f"pod {target.name} is being deleted, cannot be assigned to a host"
            )
        # Stored objects are never mutated, so the new pod shares every part a binding leaves alone
        # with the old one and copies only the three maps it changes: decoding the whole pod (its
        # managedFields included) was the largest single cost of a bind.
        old = pod.obj
        obj = {**old, "spec": {**old["spec"], "nodeName": node}, "metadata": dict(old["metadata"]),
               "status": dict(old.get("status") or {})}
        added = (body.get("metadata") or {}).get("annotations") or {}
        if added:
            obj["metadata"]["annotations"] = {**(old["metadata"].get("annotations") or {}), **added}
        conditions = [c for c in obj["status"].get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": rfc3339()}
        )
        obj["status"]["conditions"] = conditions
        self.engine.store.put(info.storage_key, obj, pod)
        return 201, _SUCCESS

    async def evict(self, request: Request, target: Target) -> tuple[int, Any]:
        body = request.json() if request.body.strip() else {}
        shapes.check_body(shapes.EVICTION, "Eviction", "policy/v1", body)
        info = self._pod_info()
        options = (body.get("deleteOptions") or {}) if isinstance(body, dict) else {}
        self._check_budgets(target.namespace or "", target.name, dry_run=request.dry_run)
        self.engine.delete(info, target.namespace or "", target.name, options, dry_run=request.dry_run)
        return 201, _SUCCESS

    def _check_budgets(self, namespace: str, name: str, *, dry_run: bool) -> None:
        """429 when a PodDisruptionBudget selecting the (healthy) pod allows no disruption (netpolicy.py)."""
        info = self._pod_info()
        pod = self.engine.get(info, namespace, name).obj
        budgets = [e.obj for _, e in self.engine.store.items(netpolicy.PDBS, namespace)
                   if netpolicy.selects(e.obj, pod)]
        if not budgets or not netpolicy.healthy(pod):
            return  # kube lets an unhealthy pod go: evicting it lowers nothing the budget counts
        pods = [e.obj for _, e in self.engine.store.items(info.storage_key, namespace)]
        for pdb in budgets:
            status = budget_status(pdb, [p for p in pods if netpolicy.selects(pdb, p)], self._scale_of)
            self._write_budget_status(pdb, status, dry_run=dry_run)
            if status["disruptionsAllowed"] < 1:
                raise netpolicy.refuse(pdb["metadata"]["name"], status)

    def _scale_of(self, ref: Mapping[str, Any], namespace: str) -> tuple[str, int] | None:
        """The scale of a pod's controller as the disruption controller reads it (budgets.py)."""
        def stored(kind: str, ns: str, name: str) -> dict[str, Any] | None:
            entry = self.engine.store.get(_SCALED.get(kind, ""), ns, name)
            return entry.obj if entry is not None else None
        return scale_from(stored)(ref, namespace)

    def _write_budget_status(self, pdb: dict[str, Any], status: dict[str, Any], *, dry_run: bool) -> None:
        entry = self.engine.store.get(netpolicy.PDBS, pdb["metadata"].get("namespace", ""), pdb["metadata"]["name"])
        if dry_run or entry is None or {**(entry.obj.get("status") or {}), **status} == entry.obj.get("status"):
            return
        obj = entry.copy()
        obj["status"] = {**(obj.get("status") or {}), **status}
        self.engine.store.put(netpolicy.PDBS, obj, entry)

    async def token_request(self, request: Request, target: Target) -> tuple[int, Any]:
        body = request.json()
        shapes.check_body(shapes.TOKEN_REQUEST, "TokenRequest", "authentication.k8s.io/v1", body)
        spec = body.get("spec") or {}
        ns = target.namespace or ""
        sa_info = self.engine.registry.get("", "v1", "serviceaccounts")
        assert sa_info is not None
        account = self.engine.get(sa_info, ns, target.name)
        seconds = spec.get("expirationSeconds")
        if seconds is None:
            seconds = 3600
        if seconds > MAX_TOKEN_SECONDS:
            raise errors.invalid(
                "TokenRequest",
                "authentication.k8s.io",
                target.name,
                [
                    validation.invalid_value(
                        "spec.expirationSeconds", seconds, "may not specify a duration larger than 2^32 seconds"
                    )
                ],
            )
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
            raise errors.invalid(
                "TokenRequest",
                "authentication.k8s.io",
                target.name,
                [
                    validation.invalid_value(
                        "spec.expirationSeconds", seconds, "may not specify a duration less than 10 minutes"
                    )
                ],
            )
        seconds = max(seconds, MIN_TOKEN_SECONDS)
        pod_name, pod_uid, node_name, node_uid = self._bound_to(ns, target.name, spec.get("boundObjectRef"))
        token, expiry = self.authority.issue(
            namespace=ns,
            service_account=target.name,
            sa_uid=account.obj["metadata"]["uid"],
            pod_name=pod_name,
            pod_uid=pod_uid,
            node_name=node_name,
            node_uid=node_uid,
            audiences=spec.get("audiences") or None,
            expiration_seconds=seconds,
        )
        stamp = rfc3339(expiry)
        result = {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": target.name, "namespace": ns, "creationTimestamp": None},
            "spec": {
                **spec,
                "expirationSeconds": seconds,
                "audiences": spec.get("audiences") or list(self.authority.api_audiences),
            },
            "status": {"token": token, "expirationTimestamp": stamp},
        }
        return 201, result

    def _bound_to(self, namespace: str, account: str, bound: Any) -> tuple[str | None, ...]:
        """(pod name, pod uid, node name, node uid) of a token bound to `bound`: a Pod, or a Node (kube's
        node-bound tokens). A pod's node goes in too, with the Node's uid when it exists (kube 1.30+)."""
        if not bound:
            return None, None, None, None
        kind = bound.get("kind")
        if kind not in ("Pod", "Node"):
            raise errors.invalid("TokenRequest", "authentication.k8s.io", account, [(
                "spec.boundObjectRef.kind", "FieldValueNotSupported",
                f'Unsupported value: "{kind}": supported values: "Node", "Pod"')])
        info = self._pod_info() if kind == "Pod" else self.engine.registry.get("", "v1", "nodes")
        assert info is not None
        found = self.engine.get(info, namespace if kind == "Pod" else "", str(bound.get("name", ""))).obj
        name, uid = found["metadata"]["name"], found["metadata"]["uid"]
        if bound.get("uid") and bound["uid"] != uid:
            raise errors.conflict(
                info.plural, "", name,
                f"the UID in the bound object reference ({bound['uid']}) does not match the UID in record. "
                "The object might have been deleted and then recreated")
        if kind == "Node":
            return None, None, name, uid
        node_name = (found.get("spec") or {}).get("nodeName") or None
        node = self.engine.store.get("/nodes", "", node_name) if node_name else None
        return name, uid, node_name, node.obj["metadata"]["uid"] if node else None

    def lookup(self, plural: str) -> Callable[[str, str], dict[str, Any] | None]:
        def find(namespace: str, name: str) -> dict[str, Any] | None:
            entry = self.engine.store.get(f"/{plural}", namespace, name)
            return entry.obj if entry else None

        return find

    def review(self, token: str, audiences: list[str] | None = None) -> dict[str, Any]:
        return self.authority.review(
            token,
            audiences=audiences,
            lookup_pod=self.lookup("pods"),
            lookup_service_account=self.lookup("serviceaccounts"),
            lookup_node=self.lookup("nodes"),
        )

    async def token_review(self, request: Request, target: Target) -> tuple[int, Any]:
        body = request.json()
        shapes.check_body(shapes.TOKEN_REVIEW, "TokenReview", "authentication.k8s.io/v1", body)
        spec = body.get("spec") or {}
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            raise errors.invalid("TokenReview", "authentication.k8s.io", "", [validation.required("spec.token")])
        status = self.review(token, spec.get("audiences") or None)
        result = {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None, **(body.get("metadata") or {})},
            "spec": spec,
            "status": status,
        }
        return 201, result
