"""The MutatingWebhookConfiguration that sends pod creations to the webhook, kept current.

Why: without it the API server never calls the webhook; with a stale caBundle it calls it and
fails every pod (failurePolicy Fail). `desired_configuration` is what the controller wants:
pods CREATE only, `failurePolicy: Fail`, `timeoutSeconds: 10`, `sideEffects: NoneOnDryRun`,
`admissionReviewVersions: [v1]`, and the objectSelector `tensor-fusion.ai/enabled In [true]` —
widened to every pod not labelled `enabled: "false"` while the dynamic config's auto-migration is
on or progressive-migration mode is (native-GPU pods must reach the webhook to be migrated, or to
be sent to tensor-fusion-scheduler). In a cluster it points at the webhook
Service; in `--role=all` at the webhook's loopback URL. `ensure_registration` creates the object
or rewrites its webhooks when they differ; with `--webhook-cert-dir` the caBundle found there is
kept (cert-manager's CA injector owns it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TypedDict

from tfusion.api import annotations as tfa
from tfusion.api.accessors import sequence_of_maps, text
from tfusion.api.jsontypes import JsonMapping
from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, NotFound

log = logging.getLogger(__name__)

MUTATING_WEBHOOK_CONFIGURATIONS = r.ApiResource("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                                             "MutatingWebhookConfiguration", False)
CONFIGURATION_NAME = "tensor-fusion-pod-webhook"
WEBHOOK_NAME = "pod.tensor-fusion.ai"
PATH = "/mutate-v1-pod"
TIMEOUT_SECONDS = 10

class ClientConfig(TypedDict, total=False):
    """Where kube-apiserver calls the webhook: `url`, or `service`; `caBundle` to trust it."""

    url: str
    service: dict[str, str | int]
    caBundle: str


class Requirement(TypedDict):
    key: str
    operator: str
    values: list[str]


class LabelSelector(TypedDict):
    matchExpressions: list[Requirement]


class RuleWithOperations(TypedDict):
    operations: list[str]
    apiGroups: list[str]
    apiVersions: list[str]
    resources: list[str]
    scope: str


class Webhook(TypedDict):
    """One entry of `webhooks`."""

    name: str
    admissionReviewVersions: list[str]
    clientConfig: ClientConfig
    rules: list[RuleWithOperations]
    failurePolicy: str
    matchPolicy: str
    sideEffects: str
    timeoutSeconds: int
    reinvocationPolicy: str
    objectSelector: LabelSelector
    namespaceSelector: dict[str, str]


class ConfigurationMeta(TypedDict):
    name: str
    labels: dict[str, str]


class WebhookConfiguration(TypedDict):
    """The MutatingWebhookConfiguration tfusion keeps current (cluster-scoped: no namespace)."""

    apiVersion: str
    kind: str
    metadata: ConfigurationMeta
    webhooks: list[Webhook]


def object_selector(widened: bool) -> LabelSelector:
    if widened:
        return {"matchExpressions": [{"key": tfa.ENABLED, "operator": "NotIn", "values": ["false"]}]}
    return {"matchExpressions": [{"key": tfa.ENABLED, "operator": "In", "values": ["true"]}]}


def client_config(*, url: str | None, service: tuple[str, str] | None, ca_bundle: str | None) -> ClientConfig:
    """`url` (role=all: the loopback address) or `service` (namespace, name) on port 443."""
    config: ClientConfig = {"url": url} if url else {}
    if service is not None and not url:
        config["service"] = {"namespace": service[0], "name": service[1], "path": PATH, "port": 443}
    if ca_bundle:
        config["caBundle"] = ca_bundle
    return config


def desired_configuration(config: ClientConfig, *, widened: bool) -> WebhookConfiguration:
    webhook: Webhook = {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "clientConfig": config,
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                   "scope": "Namespaced"}],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "NoneOnDryRun",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "reinvocationPolicy": "Never",
        "objectSelector": object_selector(widened),
        "namespaceSelector": {},
    }
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION_NAME, "labels": {"app.kubernetes.io/managed-by": "tfusion"}},
            "webhooks": [webhook]}


def _ours(current: JsonMapping) -> JsonMapping | None:
    return next((w for w in sequence_of_maps(current.get("webhooks")) if w.get("name") == WEBHOOK_NAME), None)


def _covers(actual: object, wanted: object) -> bool:
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(_covers(actual.get(k), v) for k, v in wanted.items())
    return bool(actual == wanted)


async def ensure_registration(client: KubeClient, desired: WebhookConfiguration, *, keep_ca_bundle: bool) -> str:
    """Create or update the configuration; "unchanged", "created" or "updated"."""
    try:
        current = await client.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
    except NotFound:
        try:
            await client.create(MUTATING_WEBHOOK_CONFIGURATIONS, desired)
            log.info("created MutatingWebhookConfiguration %s", CONFIGURATION_NAME)
            return "created"
        except AlreadyExists:
            current = await client.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
    wanted = Webhook(**desired["webhooks"][0])
    ours = _ours(current)
    if keep_ca_bundle and ours is not None and (bundle := text(ours, "clientConfig", "caBundle")):
        wanted["clientConfig"] = {**wanted["clientConfig"], "caBundle": bundle}
    if ours is not None and _covers(ours, wanted):
        return "unchanged"
    others = [w for w in sequence_of_maps(current.get("webhooks")) if w.get("name") != WEBHOOK_NAME]
    body = {**current, "webhooks": [*others, wanted]}
    await client.replace(MUTATING_WEBHOOK_CONFIGURATIONS, body)
    log.info("updated MutatingWebhookConfiguration %s", CONFIGURATION_NAME)
    return "updated"
