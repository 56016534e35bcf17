"""Role-based access control of the embedded API server, with kube-apiserver's semantics.

Every request but the health checks is authorized here: the request's path becomes kube's request
attributes (verb, API group, resource, subresource, namespace, name, or a non-resource path), and
the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings in the store decide. There is no HTTP
in this module: app.py builds the attributes and turns a denial into kube's 403 Status.

It runs on every request, so the policy is compiled once into an index (subject → rules, per
namespace and cluster-wide) that is rebuilt only after an RBAC object changed, decisions are
memoized per (user, attributes), and members of `system:masters` (the admin token) are allowed
before anything is looked at, as kube-apiserver's privileged-group authorizer does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from tfusion.api.selectors import SelectorError, label_selector_from_dict
from tfusion.api.timestamps import rfc3339
from tfusion.apiserver import errors
from tfusion.apiserver.store import Event, Store

GROUP = "rbac.authorization.k8s.io"
ROLES = f"{GROUP}/roles"
CLUSTER_ROLES = f"{GROUP}/clusterroles"
ROLE_BINDINGS = f"{GROUP}/rolebindings"
CLUSTER_ROLE_BINDINGS = f"{GROUP}/clusterrolebindings"
RBAC_KEYS = frozenset({ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS})

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"

#: Go's strconv.ParseBool spellings of true, which is how kube reads ?watch=
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                 "DELETE": "delete"}
#: /namespaces/<ns>/<this> is the namespace's own subresource, not a resource inside it
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_DECISION_CACHE_SIZE = 8192


# ---------------------------------------------------------------------------------------------- who
@dataclass(frozen=True, slots=True)
class UserInfo:
    """An authenticated user: what TokenReview reports and what RBAC subjects match."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def is_master(self) -> bool:
        return MASTERS in self.groups

    def as_dict(self) -> dict[str, Any]:
        """The `userInfo` shape of TokenReview, SelfSubjectReview and AdmissionReview."""
        out: dict[str, Any] = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = {k: list(v) for k, v in self.extra.items()}
        return out

    @classmethod
    def from_review(cls, user: Mapping[str, Any]) -> UserInfo:
        """The user of a successful TokenReview status."""
        extra = {str(k): tuple(str(x) for x in v) for k, v in (user.get("extra") or {}).items()}
        return cls(str(user.get("username", "")), str(user.get("uid", "")),
                   tuple(str(g) for g in user.get("groups") or ()), extra)


ADMIN = UserInfo("system:admin", groups=(MASTERS, AUTHENTICATED))


def service_account_user(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def split_service_account(username: str) -> tuple[str, str] | None:
    """(namespace, name) of `system:serviceaccount:<ns>:<name>`, else None."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    parts = username[len(SERVICE_ACCOUNT_PREFIX):].split(":")
    if len(parts) != 2 or not all(parts):
        return None
    return parts[0], parts[1]


# ---------------------------------------------------------------------------------------------- what
@dataclass(slots=True)
class Attributes:
    """kube's authorizer.Attributes: one request as RBAC sees it."""

    user: UserInfo
    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    def cache_key(self) -> tuple[Any, ...]:
        return (self.user.name, self.user.groups, self.verb, self.resource_request, self.path, self.api_group,
                self.resource, self.subresource, self.namespace, self.name)


def request_attributes(user: UserInfo, method: str, path: str, params: Mapping[str, str]) -> Attributes:
    """The attributes of an HTTP request, parsed from its path as kube-apiserver's RequestInfoFactory does."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Attributes(user, method.lower(), False, path=path)
    if rest[0] == "watch" and len(rest) > 1:
        verb, rest = "watch", rest[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if params.get("watch", "") in _TRUE else "list"
        name = _exact_name(params.get("fieldSelector", ""))
    elif not name and verb == "watch":
        name = _exact_name(params.get("fieldSelector", ""))
    elif not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user, verb, True, path=path, api_group=group, api_version=version, resource=resource,
                      subresource=subresource, namespace=namespace, name=name)


def _exact_name(selector: str) -> str:
    """A list or watch whose field selector pins metadata.name is a request for that name (kube 1.x)."""
    for term in selector.split(","):
        for operator in ("==", "="):
            key, found, value = term.partition(operator)
            if found and key.strip() == "metadata.name" and not value.startswith("="):
                value = value.strip()
                return value if value and "/" not in value and value not in (".", "..") else ""
    return ""


# ---------------------------------------------------------------------------------------------- rules
@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule, compiled into sets."""

    verbs: frozenset[str]
    groups: frozenset[str]
    resources: frozenset[str]
    names: frozenset[str]
    urls: tuple[str, ...]

    @classmethod
    def parse(cls, rule: Mapping[str, Any]) -> Rule:
        def strings(key: str) -> list[str]:
            value = rule.get(key) or []
            return [str(v) for v in value] if isinstance(value, list) else []

        return cls(frozenset(strings("verbs")), frozenset(strings("apiGroups")), frozenset(strings("resources")),
                   frozenset(strings("resourceNames")), tuple(strings("nonResourceURLs")))

    def allows(self, a: Attributes) -> bool:
        if "*" not in self.verbs and a.verb not in self.verbs:
            return False
        if not a.resource_request:
            return any(url == "*" or url == a.path or (url.endswith("*") and a.path.startswith(url.rstrip("*")))
                       for url in self.urls)
        if "*" not in self.groups and a.api_group not in self.groups:
            return False
        resources = self.resources
        if a.subresource:
            combined = f"{a.resource}/{a.subresource}"
            if "*" not in resources and combined not in resources and f"*/{a.subresource}" not in resources:
                return False
        elif "*" not in resources and a.resource not in resources:
            return False
        return not self.names or a.name in self.names

    def as_resource_rule(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verbs": sorted(self.verbs), "apiGroups": sorted(self.groups),
                               "resources": sorted(self.resources)}
        if self.names:
            out["resourceNames"] = sorted(self.names)
        return out

    def as_non_resource_rule(self) -> dict[str, Any]:
        return {"verbs": sorted(self.verbs), "nonResourceURLs": list(self.urls)}


def _parse_rules(obj: Mapping[str, Any]) -> tuple[Rule, ...]:
    rules = obj.get("rules") or []
    return tuple(Rule.parse(r) for r in rules if isinstance(r, Mapping))


def effective_cluster_role_rules(cluster_roles: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """name → rules of every ClusterRole. One with an aggregationRule has what kube's aggregation controller
    gives it: the rules of every other ClusterRole whose labels match one of its selectors (those that
    aggregate in turn contribute their aggregated rules; a cycle contributes nothing more)."""
    by_name = {str((r.get("metadata") or {}).get("name", "")): r for r in cluster_roles}
    resolved: dict[str, list[dict[str, Any]]] = {}

    def resolve(name: str, visiting: frozenset[str]) -> list[dict[str, Any]]:
        if name in resolved:
            return resolved[name]
        role = by_name[name]
        aggregation = role.get("aggregationRule")
        if not isinstance(aggregation, Mapping):
            rules = [r for r in role.get("rules") or [] if isinstance(r, dict)]
        else:
            rules = []
            selectors = []
            for selector in aggregation.get("clusterRoleSelectors") or []:
                try:
                    selectors.append(label_selector_from_dict(selector))
                except SelectorError:
                    continue
            for other in sorted(by_name):
                labels = (by_name[other].get("metadata") or {}).get("labels") or {}
                if other == name or other in visiting or not any(s.matches(labels) for s in selectors):
                    continue
                rules.extend(r for r in resolve(other, visiting | {name}) if r not in rules)
        if not visiting:
            resolved[name] = rules
        return rules

    for name in by_name:
        resolve(name, frozenset())
    return resolved


# ---------------------------------------------------------------------------------------------- index
def _subject_keys(subject: Mapping[str, Any], binding_namespace: str) -> str | None:
    kind, name = subject.get("kind"), subject.get("name")
    if not isinstance(name, str) or not name:
        return None
    if kind == "User":
        return f"u:{name}"
    if kind == "Group":
        return f"g:{name}"
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return f"u:{service_account_user(str(namespace), name)}" if namespace else None
    return None


def _user_keys(user: UserInfo) -> list[str]:
    return [f"u:{user.name}", *(f"g:{g}" for g in user.groups)]


class PolicyIndex:
    """Subject → rules, cluster-wide (ClusterRoleBindings) and per namespace (RoleBindings)."""

    def __init__(self, roles: Iterable[Mapping[str, Any]], cluster_roles: Iterable[Mapping[str, Any]],
                 role_bindings: Iterable[Mapping[str, Any]], cluster_role_bindings: Iterable[Mapping[str, Any]]):
        self.cluster_role_rules = {name: tuple(Rule.parse(r) for r in rules)
                                   for name, rules in effective_cluster_role_rules(cluster_roles).items()}
        role_rules = {(str(r["metadata"].get("namespace", "")), str(r["metadata"]["name"])): _parse_rules(r)
                      for r in roles}
        self.cluster: dict[str, list[Rule]] = {}
        self.namespaced: dict[tuple[str, str], list[Rule]] = {}
        for binding in cluster_role_bindings:
            ref = binding.get("roleRef") or {}
            granted = self.cluster_role_rules.get(str(ref.get("name"))) if ref.get("kind") == "ClusterRole" else None
            for key in self._keys(binding, "") if granted else ():
                self.cluster.setdefault(key, []).extend(granted or ())
        for binding in role_bindings:
            ns = str(binding["metadata"].get("namespace", ""))
            ref = binding.get("roleRef") or {}
            if ref.get("kind") == "ClusterRole":
                granted = self.cluster_role_rules.get(str(ref.get("name")))
            elif ref.get("kind") == "Role":
                granted = role_rules.get((ns, str(ref.get("name"))))
            else:
                granted = None
            for key in self._keys(binding, ns) if granted else ():
                # non-resource URLs have no namespace: a RoleBinding never grants them
                self.namespaced.setdefault((ns, key), []).extend(r for r in granted or () if r.resources)

    @staticmethod
    def _keys(binding: Mapping[str, Any], namespace: str) -> Iterator[str]:
        for subject in binding.get("subjects") or []:
            if isinstance(subject, Mapping):
                key = _subject_keys(subject, namespace)
                if key is not None:
                    yield key

    def rules_for(self, user: UserInfo, namespace: str) -> Iterator[Rule]:
        keys = _user_keys(user)
        for key in keys:
            yield from self.cluster.get(key, ())
        if namespace:
            for key in keys:
                yield from self.namespaced.get((namespace, key), ())

    def allows(self, a: Attributes) -> bool:
        return any(rule.allows(a) for rule in self.rules_for(a.user, a.namespace))


class Authorizer:
    """RBAC over a Store: the index follows every committed change of an RBAC object."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._index: PolicyIndex | None = None
        self._decisions: dict[tuple[Any, ...], bool] = {}
        store.listeners.append(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.storage_key in RBAC_KEYS:
            self.invalidate()

    def invalidate(self) -> None:
        self._index = None
        self._decisions = {}

    @property
    def index(self) -> PolicyIndex:
        if self._index is None:
            def objects(key: str) -> list[dict[str, Any]]:
                return [entry.obj for _, entry in self.store.items(key)]

            self._index = PolicyIndex(objects(ROLES), objects(CLUSTER_ROLES), objects(ROLE_BINDINGS),
                                      objects(CLUSTER_ROLE_BINDINGS))
        return self._index

    def allowed(self, a: Attributes) -> bool:
        if a.user.is_master:
            return True
        key = a.cache_key()
        decision = self._decisions.get(key)
        if decision is None:
            decision = self.index.allows(a)
            if len(self._decisions) >= _DECISION_CACHE_SIZE:
                self._decisions = {}
            self._decisions[key] = decision
        return decision

    def check(self, a: Attributes) -> None:
        """Raise kube's 403 unless `a` is allowed."""
        if not self.allowed(a):
            raise forbidden(a)

    def rules_review(self, user: UserInfo, namespace: str) -> dict[str, Any]:
        """The status of a SelfSubjectRulesReview: every rule that applies to `user` in `namespace`."""
        resource_rules: list[dict[str, Any]] = []
        non_resource_rules: list[dict[str, Any]] = []
        for rule in self.index.rules_for(user, namespace):
            if rule.resources:
                shaped = rule.as_resource_rule()
                if shaped not in resource_rules:
                    resource_rules.append(shaped)
            elif rule.urls:
                shaped = rule.as_non_resource_rule()
                if shaped not in non_resource_rules:
                    non_resource_rules.append(shaped)
        return {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": False}


def forbidden(a: Attributes, reason: str = "") -> errors.ApiError:
    """kube-apiserver's 403 for a request RBAC denied (responsewriters.forbiddenMessage + NewForbidden)."""
    user = a.user.name
    if not a.resource_request:
        message = f'forbidden: User "{user}" cannot {a.verb} path "{a.path}"'
        details: dict[str, Any] = {}
    else:
        resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        where = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
        why = f'User "{user}" cannot {a.verb} resource "{resource}" in API group "{a.api_group}" {where}'
        qualified = errors.qualified(a.resource, a.api_group)
        message = f'{qualified} "{a.name}" is forbidden: {why}' if a.name else f"{qualified} is forbidden: {why}"
        details = {"kind": a.resource}
        if a.name:
            details["name"] = a.name
        if a.api_group:
            details["group"] = a.api_group
    if reason:
        message = f"{message}: {reason}"
    return errors.ApiError(403, "Forbidden", message, details=details)


# ---------------------------------------------------------------------------------------------- impersonation
IMPERSONATE_USER = "impersonate-user"
IMPERSONATE_UID = "impersonate-uid"
IMPERSONATE_GROUP = "impersonate-group"
IMPERSONATE_EXTRA = "impersonate-extra-"


def impersonation_headers(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, list[str]] | None:
    """The Impersonate-* headers of a request (repeatable ones keep every value), None without any."""
    found: dict[str, list[str]] | None = None
    for key, value in raw:
        name = key.decode("latin-1").lower()
        if name.startswith("impersonate-"):
            found = found if found is not None else {}
            found.setdefault(name, []).append(value.decode("latin-1"))
    return found


def impersonate(authorizer: Authorizer, requester: UserInfo, headers: Mapping[str, list[str]]) -> UserInfo:
    """The user a request acts as after kube's impersonation checks (each a 403 when not allowed)."""
    from urllib.parse import unquote

    users = headers.get(IMPERSONATE_USER) or []
    if len(users) != 1 or not users[0]:
        asked = ", ".join(sorted(headers))
        raise errors.bad_request(f"requested {asked} without impersonating exactly one user (Impersonate-User)")
    username = users[0]
    groups = [g for g in headers.get(IMPERSONATE_GROUP, []) if g]
    uid = (headers.get(IMPERSONATE_UID) or [""])[0]
    extra: dict[str, tuple[str, ...]] = {}
    for name, values in headers.items():
        if name.startswith(IMPERSONATE_EXTRA):
            extra[unquote(name[len(IMPERSONATE_EXTRA):])] = tuple(values)

    def check(resource: str, name: str, *, group: str = "", namespace: str = "") -> None:
        attrs = Attributes(requester, "impersonate", True, api_group=group, resource=resource.split("/")[0],
                           subresource=resource.partition("/")[2], namespace=namespace, name=name)
        authorizer.check(attrs)

    account = split_service_account(username)
    if account is not None:
        check("serviceaccounts", account[1], namespace=account[0])
        groups += [SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{account[0]}"]
    else:
        check("users", username)
    for group_name in headers.get(IMPERSONATE_GROUP, []):
        check("groups", group_name)
    if uid:
        check("uids", uid, group="authentication.k8s.io")
    for key, extra_values in extra.items():
        for value in extra_values:
            check(f"userextras/{key}", value, group="authentication.k8s.io")
    if username == ANONYMOUS:
        groups.append(UNAUTHENTICATED)
    elif AUTHENTICATED not in groups:
        groups.append(AUTHENTICATED)
    return UserInfo(username, uid, tuple(dict.fromkeys(groups)), extra)


# ---------------------------------------------------------------------------------------------- validation
Cause = tuple[str, str, str]


def validate(storage_key: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[Cause]:
    """kube's validation of the four RBAC kinds (the parts a mistake would silently grant or deny)."""
    if storage_key in (ROLES, CLUSTER_ROLES):
        return _validate_rules(obj.get("rules"), namespaced=storage_key == ROLES)
    if storage_key in (ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS):
        return _validate_binding(obj, old, namespaced=storage_key == ROLE_BINDINGS)
    return []


def _validate_rules(rules: Any, *, namespaced: bool) -> list[Cause]:
    if rules is None:
        return []
    if not isinstance(rules, list):
        return [("rules", "FieldValueInvalid", f"Invalid value: {type(rules).__name__}: must be a list of rules")]
    causes: list[Cause] = []
    for index, rule in enumerate(rules):
        where = f"rules[{index}]"
        if not isinstance(rule, Mapping):
            causes.append((where, "FieldValueInvalid", "Invalid value: must be an object"))
            continue
        for key in ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs"):
            value = rule.get(key)
            if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
                causes.append((f"{where}.{key}", "FieldValueInvalid", "Invalid value: must be a list of strings"))
        if not rule.get("verbs"):
            causes.append((f"{where}.verbs", "FieldValueRequired",
                           "Required value: verbs must contain at least one value"))
        urls, resources = rule.get("nonResourceURLs") or [], rule.get("resources") or []
        if urls and namespaced:
            causes.append((f"{where}.nonResourceURLs", "FieldValueInvalid",
                           "Invalid value: namespaced rules cannot apply to non-resource URLs"))
        if urls and (resources or rule.get("apiGroups") or rule.get("resourceNames")):
            causes.append((f"{where}.nonResourceURLs", "FieldValueInvalid",
                           "Invalid value: rules cannot apply to both regular resources and non-resource URLs"))
        elif not urls:
            if not rule.get("apiGroups"):
                causes.append((f"{where}.apiGroups", "FieldValueRequired",
                               "Required value: resource rules must supply at least one api group"))
            if not resources:
                causes.append((f"{where}.resources", "FieldValueRequired",
                               "Required value: resource rules must supply at least one resource"))
    return causes


_SUBJECT_KINDS = ("User", "Group", "ServiceAccount")


def _validate_binding(obj: Mapping[str, Any], old: Mapping[str, Any] | None, *, namespaced: bool) -> list[Cause]:
    causes: list[Cause] = []
    ref = obj.get("roleRef")
    allowed_kinds = ("Role", "ClusterRole") if namespaced else ("ClusterRole",)
    if not isinstance(ref, Mapping) or not ref.get("name"):
        causes.append(("roleRef.name", "FieldValueRequired", "Required value"))
    else:
        if ref.get("kind") not in allowed_kinds:
            supported = ", ".join(f'"{k}"' for k in allowed_kinds)
            causes.append(("roleRef.kind", "FieldValueNotSupported",
                           f'Unsupported value: "{ref.get("kind")}": supported values: {supported}'))
        if ref.get("apiGroup") != GROUP:
            causes.append(("roleRef.apiGroup", "FieldValueNotSupported",
                           f'Unsupported value: "{ref.get("apiGroup")}": supported values: "{GROUP}"'))
        if old is not None and old.get("roleRef") != ref:
            causes.append(("roleRef", "FieldValueInvalid", "Invalid value: cannot change roleRef"))
    subjects = obj.get("subjects") or []
    if not isinstance(subjects, list):
        return [*causes, ("subjects", "FieldValueInvalid", "Invalid value: must be a list of subjects")]
    for index, subject in enumerate(subjects):
        where = f"subjects[{index}]"
        if not isinstance(subject, Mapping):
            causes.append((where, "FieldValueInvalid", "Invalid value: must be an object"))
            continue
        if not subject.get("name"):
            causes.append((f"{where}.name", "FieldValueRequired", "Required value"))
        kind = subject.get("kind")
        if kind not in _SUBJECT_KINDS:
            causes.append((f"{where}.kind", "FieldValueNotSupported",
                           f'Unsupported value: "{kind}": supported values: "ServiceAccount", "User", "Group"'))
        elif kind == "ServiceAccount" and not namespaced and not subject.get("namespace"):
            causes.append((f"{where}.namespace", "FieldValueRequired", "Required value"))
    return causes


def escalation_verb(storage_key: str) -> str | None:
    """The extra verb a write of this RBAC kind needs from a user outside system:masters."""
    if storage_key in (ROLES, CLUSTER_ROLES):
        return "escalate"
    if storage_key in (ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS):
        return "bind"
    return None


# ---------------------------------------------------------------------------------------------- bootstrap
_BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
_AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
_DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                   "/readyz", "/version", "/version/"]
_PUBLIC_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]

#: the subset of kube-apiserver's bootstrap policy every cluster has: (name, rules, bound groups)
BOOTSTRAP_CLUSTER_ROLES: tuple[tuple[str, list[dict[str, Any]], list[str]], ...] = (
    ("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                       {"nonResourceURLs": ["*"], "verbs": ["*"]}], [MASTERS]),
    ("system:discovery", [{"nonResourceURLs": _DISCOVERY_URLS, "verbs": ["get"]}], [AUTHENTICATED]),
    ("system:public-info-viewer", [{"nonResourceURLs": _PUBLIC_URLS, "verbs": ["get"]}],
     [AUTHENTICATED, UNAUTHENTICATED]),
    ("system:basic-user", [
        {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews",
                                                              "selfsubjectrulesreviews"], "verbs": ["create"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
    ], [AUTHENTICATED]),
)


def bootstrap_policy(store: Store) -> None:
    """Create the bootstrap ClusterRoles and their ClusterRoleBindings that are missing (as kube-apiserver
    does at every start)."""
    for name, rules, groups in BOOTSTRAP_CLUSTER_ROLES:
        if store.get(CLUSTER_ROLES, "", name) is None:
            store.put(CLUSTER_ROLES, {"apiVersion": f"{GROUP}/v1", "kind": "ClusterRole",
                                      "metadata": _bootstrap_meta(name), "rules": rules}, None)
        if store.get(CLUSTER_ROLE_BINDINGS, "", name) is None:
            store.put(CLUSTER_ROLE_BINDINGS, {
                "apiVersion": f"{GROUP}/v1", "kind": "ClusterRoleBinding", "metadata": _bootstrap_meta(name),
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": g} for g in groups],
            }, None)


def _bootstrap_meta(name: str) -> dict[str, Any]:
    return {"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": rfc3339(), "labels": dict(_BOOTSTRAP_LABELS),
            "annotations": dict(_AUTOUPDATE)}


#: the user of the request being served (AdmissionReview userInfo reads it)
CURRENT_USER: ContextVar[UserInfo] = ContextVar("tfusion_apiserver_user", default=ADMIN)
