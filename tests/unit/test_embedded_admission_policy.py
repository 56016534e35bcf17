"""The admission policy --role=all applies to the embedded API server is exactly the one deploy/ ships."""

from __future__ import annotations

from pathlib import Path

import yaml

from tfusion.embedded.identities import POLICY_FILE, shipped_policies

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "base" / "hypervisor" / "admissionpolicy.yaml"


def test_the_packaged_copy_is_the_deploy_policy() -> None:
    assert POLICY_FILE.read_text() == SHIPPED.read_text(), \
        "copy deploy/base/hypervisor/admissionpolicy.yaml into tfusion/embedded/admissionpolicy.yaml"


def test_it_is_one_policy_and_its_deny_binding() -> None:
    policy, binding = shipped_policies()
    assert (policy.kind, binding.kind) == ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    assert binding.spec["policyName"] == policy.name
    assert binding.spec["validationActions"] == ["Deny"]
    assert policy.spec["failurePolicy"] == "Fail"
    assert "namespace" not in policy.meta.raw and "namespace" not in binding.meta.raw
    assert [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d] == [policy.raw, binding.raw]
