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
from tfusion.apiserver.app import Request, Target
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
        asked = ((body.get("spec") or {}).get("resourceAttributes") or {}).get("namespace", "")
        if asked and asked != namespace:
            raise _invalid("LocalSubjectAccessReview", "spec.resourceAttributes.namespace", asked,
                           f"must match the namespace of the request ({namespace})")
        if (body.get("spec") or {}).get("nonResourceAttributes"):
            raise _invalid("LocalSubjectAccessReview", "spec.nonResourceAttributes", "set",
                           "disallowed on this kind of request")
        spec = body.setdefault("spec", {})
        spec.setdefault("resourceAttributes", {})["namespace"] = namespace
        return 201, self._answer(body, "LocalSubjectAccessReview", _subject(body, "LocalSubjectAccessReview"))

    async def self_rules(self, request: Request, target: Target) -> tuple[int, Any]:
        body = _body(request, "SelfSubjectRulesReview", AUTHORIZATION)
        namespace = (body.get("spec") or {}).get("namespace") or ""
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
    return body


def _reply(body: dict[str, Any], kind: str, group: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "apiVersion": f"{group}/v1",
            "metadata": {"creationTimestamp": None, **(body.get("metadata") or {})},
            "spec": body.get("spec") or {}, "status": status}


def _invalid(kind: str, field: str, value: Any, why: str) -> errors.ApiError:
    return errors.invalid(kind, AUTHORIZATION, "", [(field, "FieldValueInvalid", f"Invalid value: {value!r}: {why}")])


def _subject(body: Mapping[str, Any], kind: str) -> UserInfo:
    spec = body.get("spec") or {}
    user, groups = spec.get("user") or "", spec.get("groups") or []
    if not user and not groups:
        raise errors.invalid(kind, AUTHORIZATION, "", [
            ("spec.user", "FieldValueRequired", "Required value: at least one of user or group must be specified")])
    if not isinstance(user, str) or not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise _invalid(kind, "spec", {"user": user, "groups": groups},
                       "user must be a string, groups a list of strings")
    extra = {str(k): tuple(str(x) for x in v) for k, v in (spec.get("extra") or {}).items() if isinstance(v, list)}
    return UserInfo(user, str(spec.get("uid") or ""), tuple(groups), extra)


def _attributes(body: Mapping[str, Any], kind: str, user: UserInfo) -> Attributes:
    spec = body.get("spec") or {}
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if bool(resource) == bool(non_resource):
        raise errors.invalid(kind, AUTHORIZATION, "", [
            ("spec.resourceAttributes", "FieldValueRequired",
             "Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified")])
    if non_resource:
        if not isinstance(non_resource, Mapping):
            raise _invalid(kind, "spec.nonResourceAttributes", non_resource, "must be an object")
        return Attributes(user, str(non_resource.get("verb") or ""), False, path=str(non_resource.get("path") or ""))
    if not isinstance(resource, Mapping):
        raise _invalid(kind, "spec.resourceAttributes", resource, "must be an object")

    def text(key: str) -> str:
        value = resource.get(key) or ""
        if not isinstance(value, str):
            raise _invalid(kind, f"spec.resourceAttributes.{key}", value, "must be a string")
        return value

    return Attributes(user, text("verb"), True, api_group=text("group"), api_version=text("version"),
                      resource=text("resource"), subresource=text("subresource"), namespace=text("namespace"),
                      name=text("name"))
