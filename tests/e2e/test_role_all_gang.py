"""`tfusion --role=all` places the original's gang sample (gang-scheduling-workloads.yaml: a strict
Deployment of 4, an Indexed Job of 4 with gang-min-members 2, and a Deployment without a gang)
applied with kubectl, all members or none: with room for only 3 of the Deployment's 4 members
nothing binds, the group times out and releases everything; with room for all, all bind and the
workload's status.gang says Running.

The sample is used through a copy edited here only where it must be: every pod is labelled
`tensor-fusion.ai/enabled: "true"` (the pod webhook's selector) and names the simulated pool, the
gang timeout is a few seconds instead of 5 m, and the requests are sized to the simulated
GPUs (312, 312 and 989 TFLOPS): the strict gang's members ask 250 TFLOPS (the pool could hold 5 of
them), the non-gang Deployment, scaled to 1, takes 500 TFLOPS of the 989-TFLOPS GPU, which leaves
room for 3 members."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers.kubectl import KUBECTL, needs_kubectl
from tests.helpers.role_all import NODE, POOL, TF, RoleAll

#: the original's published sample, beside the repository as test_samples.py reads it
SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "conformance" / "upstream-samples" / \
    "gang-scheduling-workloads.yaml"
PODS = "/api/v1/namespaces/default/pods"
STRICT = "tf-deploy-gang-strict"
JOB = "tf-job-gang-min-members-override"
PLAIN = "tf-deploy-no-gang"

pytestmark = needs_kubectl


def sample() -> dict[str, dict[str, Any]]:
    """The sample's documents by name, edited as the module docstring says."""
    if not SAMPLE.exists():
        pytest.skip(f"the upstream sample {SAMPLE} is not available")
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(SAMPLE.read_text()) if d}
    tflops = {STRICT: "250", JOB: "20", PLAIN: "500"}
    for name, doc in docs.items():
        meta = doc["spec"]["template"]["metadata"]
        meta["labels"]["tensor-fusion.ai/enabled"] = "true"  # what the pod webhook selects on
        notes = meta["annotations"]
        notes["tensor-fusion.ai/gpupool"] = POOL
        notes["tensor-fusion.ai/tflops-request"] = tflops[name]
        if "tensor-fusion.ai/gang-timeout" in notes:
            notes["tensor-fusion.ai/gang-timeout"] = "3s"
    docs[PLAIN]["spec"]["replicas"] = 1
    return docs


def kubectl(run: RoleAll, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run([KUBECTL, "--kubeconfig", str(run.kubeconfig), *args], capture_output=True, text=True,
                            input=stdin, timeout=60, env={**os.environ, "HOME": str(run.tmp)})
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stdout}\n{result.stderr}"
    return result.stdout


def pods_of(run: RoleAll, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = run.get(f"{PODS}?labelSelector=app%3D{app}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def bound_pods(run: RoleAll, app: str) -> list[str]:
    return [p["metadata"]["name"] for p in pods_of(run, app) if p["spec"].get("nodeName")]


def gang_of(run: RoleAll, workload: str) -> dict[str, Any]:
    found = run.get(f"{TF}/namespaces/default/tensorfusionworkloads/{workload}")
    gang: dict[str, Any] = (found.get("status") or {}).get("gang") or {}
    return gang


def test_gang_sample_places_all_members_or_none(role_all: RoleAll) -> None:
    run = role_all
    docs = sample()
    run.start()
    run.wait_for("the controller and hypervisor to be ready", run.ready, timeout=60)
    kubectl(run, "apply", "-f", "-", stdin=yaml.safe_dump(docs[PLAIN]))
    run.wait_for("the non-gang pod bound", lambda: bound_pods(run, PLAIN), timeout=60)

    # room for 3 of the 4 strict members: none binds, the gang times out and releases everything
    kubectl(run, "apply", "-f", "-", stdin=yaml.safe_dump(docs[STRICT]))
    members = run.wait_for("4 strict members", lambda: (lambda p: p if len(p) == 4 else None)(pods_of(run, STRICT)),
                           timeout=60)
    notes = members[0]["metadata"]["annotations"]
    assert notes["tensor-fusion.ai/gang-group-key"] == f"default/{STRICT}"
    assert notes["tensor-fusion.ai/gang-required-members"] == "4"
    timed_out = run.wait_for("status.gang TimedOut", lambda: (lambda g: g if g.get("phase") == "TimedOut" else None)(
        gang_of(run, STRICT)), timeout=60)
    assert timed_out["groupKey"] == f"default/{STRICT}" and timed_out["desiredMembers"] == 4
    assert timed_out["waitingMembers"] == 0 and timed_out["backoffUntil"]
    assert bound_pods(run, STRICT) == []
    events = run.get("/api/v1/namespaces/default/events")["items"]
    assert any(e.get("reason") == "GangTimedOut" and e["involvedObject"]["name"].startswith(STRICT) for e in events)
    # nothing of the gang is held: the allocator holds the non-gang pod alone
    held = httpx.get(f"{run.controller}/api/allocation", timeout=5).json()["nodeWorkerStore"].get(NODE, {})
    assert [key.split("/")[1].startswith(PLAIN) for key in held] == [True], held
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # and it stays that way: all or nothing, never a part
        assert bound_pods(run, STRICT) == []
        time.sleep(0.2)

    # room for all: the non-gang Deployment scaled to 0, the strict gang binds whole after its backoff
    kubectl(run, "scale", "deployment", PLAIN, "--replicas=0")
    run.wait_for("the 4 strict members bound", lambda: len(bound_pods(run, STRICT)) == 4, timeout=90)
    running = run.wait_for("status.gang Running", lambda: (lambda g: g if g.get("phase") == "Running" else None)(
        gang_of(run, STRICT)), timeout=60)
    assert running["readyMembers"] == 4

    # the Indexed Job: 2 of its 4 required (the annotation overrides replicas); room for all, all bind
    kubectl(run, "apply", "-f", "-", stdin=yaml.safe_dump(docs[JOB]))
    job_pods = run.wait_for("4 job members", lambda: (lambda p: p if len(p) == 4 else None)(pods_of(run, JOB)),
                            timeout=60)
    assert {p["metadata"]["annotations"]["tensor-fusion.ai/gang-required-members"] for p in job_pods} == {"2"}
    run.wait_for("the 4 job members bound", lambda: len(bound_pods(run, JOB)) == 4, timeout=60)
