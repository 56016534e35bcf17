"""`tfusion doctor`'s rules on values made here: certificates against a caBundle, CRD schema
differences, Lease freshness, GPU drift, the shipped RBAC's needs, the output and exit codes."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, cast

import pytest
from cryptography import x509

from tests.admission_helpers import CertificateAuthority
from tests.helpers.cli import run_main
from tfusion.api import crds as tf_crds
from tfusion.api.accessors import Body
from tfusion.doctor.certificates import load_bundle, verify_serving
from tfusion.doctor.cluster import gpu_drift
from tfusion.doctor.control import lease_state
from tfusion.doctor.crds import schema_difference
from tfusion.doctor.findings import error, exit_code, ok, render_json, render_text, warning
from tfusion.doctor.rbac import review, shipped_needs


def _chain(ca: CertificateAuthority, dns: list[str], ips: list[str]) -> list[x509.Certificate]:
    pem, _ = ca.issue(dns, ips)
    return x509.load_pem_x509_certificates(pem)


def test_a_bundle_verifies_only_certificates_its_ca_signed_for_the_host_while_valid() -> None:
    ca, stranger = CertificateAuthority("tfusion-ca"), CertificateAuthority("stranger-ca")
    chain = _chain(ca, ["tensor-fusion-webhook.tensor-fusion-sys.svc"], ["127.0.0.1"])
    bundle = load_bundle(ca.bundle)
    now = dt.datetime.now(dt.UTC)  # the certificates were issued just now, not when the module was loaded
    assert verify_serving(chain, bundle, "127.0.0.1", now) == ""
    assert verify_serving(chain, bundle, "tensor-fusion-webhook.tensor-fusion-sys.svc", now) == ""
    # a rotated CA keeps the old one in the bundle: either verifies
    assert verify_serving(chain, [*load_bundle(stranger.bundle), *bundle], "127.0.0.1", now) == ""
    wrong = verify_serving(chain, load_bundle(stranger.bundle), "127.0.0.1", now)
    assert "not signed by any CA of the caBundle" in wrong and "CN=stranger-ca" in wrong
    assert "does not name 10.0.0.1" in verify_serving(chain, bundle, "10.0.0.1", now)
    assert "expired" in verify_serving(chain, bundle, "127.0.0.1", now + dt.timedelta(days=2))
    assert "not valid before" in verify_serving(chain, bundle, "127.0.0.1", now - dt.timedelta(hours=1))


@pytest.mark.parametrize(("bundle", "said"), [("not base64!", "not base64"), ("", "no PEM certificate"),
                                              ("aGVsbG8=", "no PEM certificate")])
def test_a_bad_ca_bundle_says_what_is_wrong(bundle: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        load_bundle(bundle)


def test_a_crd_differs_from_ours_at_the_first_changed_path() -> None:
    ours = tf_crds.crd_for("GPUPool")
    assert schema_difference(ours, json.loads(json.dumps(ours))) == ""
    older = json.loads(json.dumps(ours))
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert schema_difference(ours, older) == "v1.schema.openAPIV3Schema.properties.status: missing on the cluster"
    older = json.loads(json.dumps(ours))
    older["spec"]["versions"][0]["name"] = "v1alpha1"
    assert schema_difference(ours, older) == "version v1 is not defined"
    # fields the API server adds beside the versions are not ours to judge
    assert schema_difference(ours, {**ours, "status": {"acceptedNames": {}}}) == ""


def test_a_lease_is_held_while_renewed_within_its_duration() -> None:
    lease = {"spec": {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00.000000Z", "leaseDurationSeconds": 15}}
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
    assert lease_state(lease, start + 10).held
    assert not lease_state(lease, start + 16).held
    assert not lease_state({"spec": {"renewTime": "2026-01-01T00:00:00Z"}}, start).held  # nobody holds it
    assert lease_state({"spec": {"holderIdentity": "a"}}, start).age_s is None


def _gpu(available: dict[str, str], capacity: dict[str, str]) -> Body:
    return Body({"metadata": {"name": "g"}, "status": {"available": available, "capacity": capacity}})


def test_gpu_drift_is_available_outside_zero_to_capacity() -> None:
    assert gpu_drift(_gpu({"tflops": "100", "vram": "10Gi"}, {"tflops": "312", "vram": "80Gi"})) == ""
    assert "below zero" in gpu_drift(_gpu({"tflops": "-1", "vram": "10Gi"}, {"tflops": "312", "vram": "80Gi"}))
    assert "vram available 81Gi exceeds its capacity 80Gi" in gpu_drift(
        _gpu({"tflops": "1", "vram": "81Gi"}, {"tflops": "312", "vram": "80Gi"}))


def test_the_shipped_accounts_need_what_their_bindings_grant() -> None:
    needs = shipped_needs("tf-ns")
    assert {n.account for n in needs} == {"tensor-fusion-operator", "tensor-fusion-hypervisor-sa"}
    lease = next(n for n in needs if n.resource == "leases" and n.verb == "update")
    assert lease.namespace == "tf-ns" and lease.account == "tensor-fusion-operator"  # a Role: its namespace only
    status = next(n for n in needs if n.resource == "gpus/status" and n.account == "tensor-fusion-hypervisor-sa")
    spec: Any = review(status, "tf-ns")["spec"]
    assert spec["user"] == "system:serviceaccount:tf-ns:tensor-fusion-hypervisor-sa"
    assert spec["resourceAttributes"] == {"verb": status.verb, "group": "tensor-fusion.ai", "resource": "gpus",
                                          "subresource": "status"}


def test_findings_print_with_their_fix_and_set_the_exit_code() -> None:
    findings = [ok("crds", "all there"), warning("clock", "a bit off", "sync it"), error("webhook", "broken", "fix it")]
    text = render_text(findings)
    assert "ERROR    webhook  broken\n                  fix: fix it\n" in text
    assert text.endswith("1 error(s), 1 warning(s), 0 info, 1 ok\n")
    body = json.loads(render_json(findings))
    assert body["findings"][2] == {"check": "webhook", "severity": "error", "message": "broken", "fix": "fix it"}
    assert body["summary"] == {"ok": 1, "info": 0, "warning": 1, "error": 1}
    assert exit_code(findings) == 1 and exit_code(findings[:2]) == 0


@pytest.mark.parametrize(("argv", "said"), [
    (["-o", "yaml"], "argument -o/--output: invalid choice: 'yaml'"),
    (["--hypervisor-port", "0"], "'0' is not a port; expected 1..65535"),
])
def test_bad_arguments_exit_2_naming_the_flag(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["doctor", *argv], capsys)
    assert code == 2 and said in err and err.startswith("tfusion doctor: error:")


def test_an_api_server_that_cannot_be_used_exits_1(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["doctor", "--kube", str(tmp_path / "nothing")], capsys)
    assert code == 1 and "tfusion doctor: cannot use the API server: --kube=" in err


def test_the_original_operators_settings_are_judged_by_tfusions() -> None:
    from tfusion.doctor.original import config_findings, env_findings, flag_findings, original_containers

    # the chart's command: flags tfusion has pass silently, the ones it lacks are named
    said = [f.message for f in flag_findings(["-metrics-secure", "-leader-elect",
                                              "-host-port-range=40000-42000", "-no-such-flag"])]
    assert said == ["flag -metrics-secure: tfusion has no such flag (it would refuse to start with it)",
                    "flag -no-such-flag: tfusion has no such flag (it would refuse to start with it)"]
    [bad_range] = flag_findings(["-host-port-range", "42000-40000"])
    assert bad_range.severity == "warning" and "tfusion refuses the value" in bad_range.message

    found = env_findings([{"name": "TF_ISOLATION_MODE_POLICY", "value": "sometimes"},
                          {"name": "GO_TESTING", "value": "true"},
                          {"name": "ENABLE_WEBHOOKS", "value": "true"},
                          {"name": "DEBUG_FORCE_GPUNODE_STATE",
                           "valueFrom": {"configMapKeyRef": {"name": "s", "key": "k"}}},
                          {"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}])
    messages = [f.message for f in found]
    assert len(messages) == 3, messages
    assert messages[0].startswith("tfusion refuses environment variable TF_ISOLATION_MODE_POLICY='sometimes': expected")
    assert "GO_TESTING: tfusion declares it but does not implement it" in messages[1]
    assert messages[2] == ("environment variable DEBUG_FORCE_GPUNODE_STATE: tfusion does not read it, so it has no "
                           "effect there")

    assert [f.severity for f in config_findings("cm", "metricsTTL: 30d\nmetricsFormat: influx\n")] == ["info"]
    [refused] = config_findings("cm", "metricsFormat: csv\n")
    assert "metricsFormat: 'csv' is not one of" in refused.message

    deployment = {"spec": {"template": {"spec": {"containers": [
        {"name": "manager", "image": "tensorfusion/tensor-fusion-operator:1.2"},
        {"name": "vector", "image": "vector"}]}}}}
    assert [c["name"] for c in original_containers(deployment)] == ["manager"]


def test_rbac_names_what_each_account_may_not_do() -> None:
    from tfusion.doctor.rbac import rbac_findings

    needs = shipped_needs("tf-ns")
    operator = [n for n in needs if n.account == "tensor-fusion-operator"]
    hypervisor = [n for n in needs if n.account == "tensor-fusion-hypervisor-sa"]
    [some] = rbac_findings("tf-ns", needs, operator[:2])
    assert some.message == (f"ServiceAccount tf-ns/tensor-fusion-operator may not: {operator[0].describe()} "
                            f"({operator[0].source}); {operator[1].describe()} ({operator[1].source})")
    [none] = rbac_findings("tf-ns", needs, hypervisor)
    assert none.message.startswith(f"ServiceAccount tf-ns/tensor-fusion-hypervisor-sa may do none of the "
                                   f"{len(hypervisor)} things")
    [fine] = rbac_findings("tf-ns", needs, [])
    assert fine.severity == "ok"


def test_a_check_that_fails_is_a_finding_and_the_next_check_runs() -> None:
    import anyio

    from tfusion.doctor.context import Context
    from tfusion.doctor.findings import Finding
    from tfusion.doctor.run import run_checks
    from tfusion.kube.client import Forbidden, KubeClient, NotFound, ServerError

    def failing(exc: Exception) -> Any:
        async def check(ctx: Context) -> list[Finding]:
            raise exc
        return check

    async def fine(ctx: Context) -> list[Finding]:
        return [ok("fine", "ran")]

    checks = [("missing", failing(NotFound({"message": "the server could not find gpunodes"}, 404))),
              ("forbidden", failing(Forbidden({"message": "no"}, 403))),
              ("broken", failing(ServerError({"message": "boom"}, 500))), ("fine", fine)]
    ctx = Context(cast(KubeClient, None), "ns", 8001, clock_skew_s=0.0)
    findings = anyio.run(run_checks, ctx, checks)
    assert [(f.check, f.severity) for f in findings] == [("missing", "error"), ("forbidden", "warning"),
                                                         ("broken", "error"), ("fine", "ok")]
    assert "see the crds check" in findings[0].fix and "cannot check: your credentials" in findings[1].message
