"""The access-review endpoints behind `kubectl auth can-i` and `kubectl auth whoami`.

SelfSubjectAccessReview, SubjectAccessReview and LocalSubjectAccessReview (authorization.k8s.io/v1)
ask the RBAC authorizer one question; SelfSubjectRulesReview lists what applies to the caller in a
namespace (`can-i --list`); SelfSubjectReview (authentication.k8s.io/v1) says who the caller is.
Like kube-apiserver, none is stored: the request object comes back with its `status` filled in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tfusion.apiserver import errors
from tfusion.apiserver.asgi import Request, Target
from tfusion.apiserver.rbac import Attributes, Authorizer, UserInfo

Handler = Callable[[Request, Target], Awaitable[tuple[int, Any]]]
AUTHORIZATION = "authorization.k8s.io"
AUTHENTICATION = "authentication.k8s.io"


class Reviews:
    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def handlers(self) -> dict[tuple[str, str], Handler]:
        return {
            (f"{AUTHORIZATION}/selfsubjectaccessreviews", "create"): self.self_access,
            (f"{AUTHORIZATION}/subjectaccessreviews", "create"): self.subject_access,
            (f"{AUTHORIZATION}/localsubjectaccessreviews", "create"): self.local_subject_access,
            (f"{AUTHORIZATION}/selfsubjectrulesreviews", "create"): self.self_rules,
            (f"{AUTHENTICATION}/selfsubjectreviews", "create"): self.self_subject,
        }

    async def self_access(self, request: Request, target: Target) -> tuple[int, Any]:
        body = _body(request, "SelfSubjectAccessReview", AUTHORIZATION)
        return 201, self._answer(body, "SelfSubjectAccessReview", request.user)

    async def subject_access(self, request: Request, target: Target) -> tuple[int, Any]:
        body = _body(request, "SubjectAccessReview", AUTHORIZATION)
        return 201, self._answer(body, "SubjectAccessReview", _subject(body, "SubjectAccessReview"))

    async def local_subject_access(self, request: Request, target: Target) -> tuple[int, Any]:
        body = _body(request, "LocalSubjectAccessReview", AUTHORIZATION)
        namespace = target.namespace or ""
        spec = body["spec"] = _spec(body, "LocalSubjectAccessReview")
        resource = _mapping(spec.get("resourceAttributes"), "LocalSubjectAccessReview", "spec.resourceAttributes")
        asked = resource.get("namespace") or ""
        if asked and asked != namespace:
            raise _invalid("LocalSubjectAccessReview", "spec.resourceAttributes.namespace", asked,
                           f"must match the namespace of the request ({namespace})")
        if spec.get("nonResourceAttributes"):
            raise _invalid("LocalSubjectAccessReview", "spec.nonResourceAttributes", "set",
                           "disallowed on this kind of request")
        spec["resourceAttributes"] = {**resource, "namespace": namespace}
        return 201, self._answer(body, "LocalSubjectAccessReview", _subject(body, "LocalSubjectAccessReview"))

    async def self_rules(self, request: Request, target: Target) -> tuple[int, Any]:
        body = _body(request, "SelfSubjectRulesReview", AUTHORIZATION)
        namespace = _spec(body, "SelfSubjectRulesReview").get("namespace") or ""
        if not isinstance(namespace, str):
            raise _invalid("SelfSubjectRulesReview", "spec.namespace", namespace, "must be a string")
        return 201, _reply(body, "SelfSubjectRulesReview", AUTHORIZATION,
                           self.authorizer.rules_review(request.user, namespace))

    async def self_subject(self, request: Request, target: Target) -> tuple[int, Any]:
        body = _body(request, "SelfSubjectReview", AUTHENTICATION)
        return 201, _reply(body, "SelfSubjectReview", AUTHENTICATION, {"userInfo": request.user.as_dict()})

    def _answer(self, body: dict[str, Any], kind: str, user: UserInfo) -> dict[str, Any]:
        attributes = _attributes(body, kind, user)
        allowed = self.authorizer.allowed(attributes)
        return _reply(body, kind, AUTHORIZATION, {"allowed": allowed})


def _body(request: Request, kind: str, group: str) -> dict[str, Any]:
    body = request.json()
    if not isinstance(body, dict):
        raise errors.bad_request(f"{kind}: the body must be a JSON object")
    sent_kind, sent_version = body.get("kind"), body.get("apiVersion")
    if sent_kind not in (None, kind) or sent_version not in (None, f"{group}/v1"):
        raise errors.bad_request(f"{kind}: got kind {sent_kind!r} apiVersion {sent_version!r}, "
                                 f"expected kind {kind!r} apiVersion {group + '/v1'!r}")
    _mapping(body.get("metadata"), kind, "metadata", group)
    _spec(body, kind, group)
    return body


def _mapping(value: Any, kind: str, field: str, group: str = AUTHORIZATION) -> dict[str, Any]:
    """`value` when it is an object; {} when absent (null); else 422 naming the field."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(kind, field, value, "must be an object", group)
    return value


def _spec(body: Mapping[str, Any], kind: str, group: str = AUTHORIZATION) -> dict[str, Any]:
    return _mapping(body.get("spec"), kind, "spec", group)


def _reply(body: dict[str, Any], kind: str, group: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "apiVersion": f"{group}/v1",
            "metadata": {"creationTimestamp": None, **(body.get("metadata") or {})},
            "spec": body.get("spec") or {}, "status": status}


def _invalid(kind: str, field: str, value: Any, why: str, group: str = AUTHORIZATION) -> errors.ApiError:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return errors.invalid(kind, group, "", [(field, "FieldValueInvalid", f"Invalid value: {text}: {why}")])


def _subject(body: Mapping[str, Any], kind: str) -> UserInfo:
    spec = _spec(body, kind)
    user, groups = spec.get("user") or "", spec.get("groups") or []
    if not user and not groups:
        raise errors.invalid(kind, AUTHORIZATION, "", [
            ("spec.user", "FieldValueRequired", "Required value: at least one of user or group must be specified")])
    if not isinstance(user, str) or not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise _invalid(kind, "spec", {"user": user, "groups": groups},
                       "user must be a string, groups a list of strings")
    uid = spec.get("uid") or ""
    if not isinstance(uid, str):
        raise _invalid(kind, "spec.uid", uid, "must be a string")
    return UserInfo(user, uid, tuple(groups), _extra(spec.get("extra"), kind))


def _extra(value: Any, kind: str) -> dict[str, tuple[str, ...]]:
    """spec.extra is a map of string lists (client-go's ExtraValue); anything else is refused, not dropped."""
    extra = _mapping(value, kind, "spec.extra")
    for key, values in extra.items():
        if not isinstance(values, list) or not all(isinstance(x, str) for x in values):
            raise _invalid(kind, f"spec.extra[{key}]", values, "must be a list of strings")
    return {key: tuple(values) for key, values in extra.items()}


def _attributes(body: Mapping[str, Any], kind: str, user: UserInfo) -> Attributes:
    spec = _spec(body, kind)
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if bool(resource) == bool(non_resource):
        raise errors.invalid(kind, AUTHORIZATION, "", [
            ("spec.resourceAttributes", "FieldValueRequired",
             "Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified")])
    if non_resource:
        path = _mapping(non_resource, kind, "spec.nonResourceAttributes")
        return Attributes(user, _text(path, kind, "spec.nonResourceAttributes", "verb"), False,
                          path=_text(path, kind, "spec.nonResourceAttributes", "path"))
    fields = _mapping(resource, kind, "spec.resourceAttributes")

    def text(key: str) -> str:
        return _text(fields, kind, "spec.resourceAttributes", key)

    return Attributes(user, text("verb"), True, api_group=text("group"), api_version=text("version"),
                      resource=text("resource"), subresource=text("subresource"), namespace=text("namespace"),
                      name=text("name"))


def _text(fields: Mapping[str, Any], kind: str, where: str, key: str) -> str:
    value = fields.get(key) or ""
    if not isinstance(value, str):
        raise _invalid(kind, f"{where}.{key}", value, "must be a string")
    return value
