"""The pod webhook: registered, its caBundle verifies the certificate it serves, and the API server
reaches it.

Why three parts: with `failurePolicy: Fail` a webhook the API server cannot call rejects every
pod labelled for tfusion, and a missing configuration silently leaves GPU pods unmutated (so they
stay Pending). The certificate is read where it is served: at the configuration's `url`
(`--role=all`), or from the certificate Secret the controller keeps for the Service; the API
server's own call is tested with a server-side dry-run create of a labelled pod (the webhook has no
side effects on a dry run), which also covers Service endpoints and network policies.
"""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

import anyio
from anyio.streams.tls import TLSAttribute
from cryptography import x509

from tfusion.api import annotations as tfa
from tfusion.api.accessors import section, sequence_of_maps, text
from tfusion.controller.webhook.certs import SECRET_NAME, TLS_CRT
from tfusion.controller.webhook.registration import (
    CONFIGURATION_NAME,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    WEBHOOK_NAME,
)
from tfusion.doctor.certificates import load_bundle, verify_serving
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding, error, ok, warning
from tfusion.kube import resources as r
from tfusion.kube.client import Forbidden, KubeError, NotFound

CHECK = "webhook"
PROBE_NAMESPACE = "default"


def _restart_fix(ctx: Context) -> str:
    return (f"the controller rewrites caBundle from its Secret {ctx.namespace}/{SECRET_NAME} when it starts (and "
            f"at its periodic check): `kubectl -n {ctx.namespace} rollout restart deployment/tensor-fusion-controller` "
            "(--role=all: restart it); with --webhook-cert-dir (cert-manager) check that the configuration's "
            "cert-manager.io/inject-ca-from annotation names the webhook's Certificate")


async def check(ctx: Context) -> list[Finding]:
    try:
        config = await ctx.client.get(MUTATING_WEBHOOK_CONFIGURATIONS, CONFIGURATION_NAME)
    except NotFound:
        return [error(CHECK, f"no MutatingWebhookConfiguration {CONFIGURATION_NAME}: the API server never sends "
                             "pods to tfusion, so GPU pods are not mutated and stay Pending",
                      "start the controller with its webhook on (ENABLE_WEBHOOKS not false): it registers the "
                      "configuration; or apply deploy/base")]
    ours = next((w for w in sequence_of_maps(config.get("webhooks")) if w.get("name") == WEBHOOK_NAME), None)
    if ours is None:
        return [error(CHECK, f"MutatingWebhookConfiguration {CONFIGURATION_NAME} has no webhook {WEBHOOK_NAME}",
                      "restart the controller: it adds its webhook to the configuration")]
    return [await _certificate(ctx, section(ours, "clientConfig")), await _dry_run(ctx)]


async def _certificate(ctx: Context, client_config: Mapping[str, object]) -> Finding:
    try:
        bundle = load_bundle(text(client_config, "caBundle"))
    except ValueError as exc:
        return error(CHECK, f"{CONFIGURATION_NAME}: {exc}; the API server cannot verify the webhook", _restart_fix(ctx))
    url = text(client_config, "url")
    if url:
        where, host = url, urlsplit(url).hostname or ""
        chain = await _served_chain(url, ctx.timeout_s)
        if isinstance(chain, str) and chain.startswith(ConnectionRefusedError.__name__):
            return error(CHECK, f"the webhook at {url} does not answer: {chain}",
                         "start the controller (its log says 'pod webhook listening on ...'), or fix the url")
        if isinstance(chain, str):  # maybe reachable from the API server only: the dry run below tells
            return warning(CHECK, f"cannot read the webhook's certificate at {url} from here: {chain}")
    else:
        service = section(client_config, "service")
        name, namespace = text(service, "name"), text(service, "namespace")
        where, host = f"Service {namespace}/{name}", f"{name}.{namespace}.svc"
        found = await _secret_chain(ctx, namespace)
        if found is None:
            return ok(CHECK, f"caBundle holds {len(bundle)} CA(s); the serving certificate is not in "
                             f"{namespace}/{SECRET_NAME} (cert-manager?), so only the dry run below checks it")
        chain = found
    problem = verify_serving(chain, bundle, host, dt.datetime.fromtimestamp(ctx.server_now(), dt.UTC))
    if problem:
        return error(CHECK, f"caBundle of {CONFIGURATION_NAME} does not verify the webhook's certificate at {where}: "
                            f"{problem}; the API server refuses every pod labelled {tfa.ENABLED}=true",
                     _restart_fix(ctx))
    return ok(CHECK, f"caBundle of {CONFIGURATION_NAME} verifies the certificate served at {where}")


async def _served_chain(url: str, timeout_s: float) -> list[x509.Certificate] | str:
    """The certificate the webhook serves (read, not trusted: the caBundle judges it), or why not."""
    parts = urlsplit(url)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with anyio.fail_after(timeout_s):
            stream = await anyio.connect_tcp(parts.hostname or "", parts.port or 443, tls=True,
                                             ssl_context=context, tls_standard_compatible=False)
    except (OSError, TimeoutError, anyio.BrokenResourceError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ConnectionRefusedError) else exc  # anyio wraps it
        return f"{type(cause).__name__}: {cause}"
    async with stream:
        der = stream.extra(TLSAttribute.peer_certificate_binary)
    return [x509.load_der_x509_certificate(der)] if der else "it served no certificate"


async def _secret_chain(ctx: Context, namespace: str) -> list[x509.Certificate] | None:
    try:
        secret = await ctx.client.get(r.SECRETS, SECRET_NAME, namespace=namespace)
    except (NotFound, Forbidden):
        return None
    try:
        return x509.load_pem_x509_certificates(base64.b64decode(text(secret, "data", TLS_CRT)))
    except ValueError:
        return None


def probe_pod() -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "tfusion-doctor-probe-", "namespace": PROBE_NAMESPACE,
                         "labels": {tfa.ENABLED: "true"}},
            "spec": {"containers": [{"name": "probe", "image": "tfusion-doctor-probe"}]}}


async def _dry_run(ctx: Context) -> Finding:
    try:
        await ctx.client.create(r.PODS, probe_pod(), namespace=PROBE_NAMESPACE, params={"dryRun": "All"})
    except Forbidden as exc:
        return warning(CHECK, f"cannot test the API server's call of the webhook: a dry-run pod create is "
                              f"forbidden to you ({exc})", "run tfusion doctor with a kubeconfig that may create pods")
    except KubeError as exc:
        return _judge_refusal(ctx, str(exc))
    return ok(CHECK, "the API server calls the webhook (it admitted a dry-run pod)")


def _judge_refusal(ctx: Context, message: str) -> Finding:
    if f'webhook "{WEBHOOK_NAME}" denied' in message:  # the webhook answered: it is reached
        return ok(CHECK, "the API server calls the webhook (it answered a dry-run pod)")
    if "failed calling webhook" not in message:
        return warning(CHECK, f"a dry-run pod create failed for another reason: {message}")
    certificate = any(word in message.lower() for word in ("certificate", "x509", "tls", "ssl"))
    fix = (_restart_fix(ctx) if certificate else
           f"check that Service {ctx.namespace}/tensor-fusion-webhook has ready endpoints "
           f"(`kubectl -n {ctx.namespace} get endpoints tensor-fusion-webhook`) and that no NetworkPolicy or "
           "firewall stops the API server from reaching port 9443 of the controller")
    return error(CHECK, f"the API server cannot call the webhook: {message}", fix)
