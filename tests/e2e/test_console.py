"""The console in a real browser (Debian's Chromium through Playwright) against `tfusion --role=all`,
and `tfusion console` run as a user would, finding the controller by itself.

What a user must be able to rely on: the banner's URL opens the console; the overview names the
simulated GPUs and the pool; a pod created with kubectl appears on its GPU's bar without a reload;
an impossible pod is on Pending with the scheduler's suggestion and the command that applies it; a
chart has data after a metrics tick; no page logs a browser error. A screenshot of each page is
written (under $TFUSION_SCREENSHOTS when set).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.helpers.browser import TIMEOUT_MS, BrowserPage, needs_browser
from tests.helpers.kubectl import Kubectl
from tests.helpers.role_all import RoleAll, free_ports

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "my-pod.yaml"
IMPOSSIBLE = """
apiVersion: v1
kind: Pod
metadata:
  name: too-big
  namespace: default
  labels: {tensor-fusion.ai/enabled: "true"}
  annotations:
    tensor-fusion.ai/tflops-request: "5000"
    tensor-fusion.ai/vram-request: 8Gi
spec:
  schedulerName: tensor-fusion-scheduler
  containers: [{name: app, image: busybox}]
"""
PAGES = ("/", "/gpus", "/workloads", "/pending", "/quotas", "/events", "/usage")


def _console_args(run: RoleAll) -> None:
    run.serve_console()
    # both recorders write where the console reads, and often enough for a test to see a tick
    at = run.args.index("--metrics-output-path")
    run.args[at + 1] = str(run.tmp / "metrics" / "hypervisor.log")
    run.args += ["--metrics-interval", "1s"]


def _gpu_of(run: RoleAll, pod: str) -> str | None:
    found = run.get(f"/api/v1/namespaces/default/pods/{pod}")
    return found["metadata"].get("annotations", {}).get("tensor-fusion.ai/gpu-ids") or None


@needs_browser
def test_the_console_shows_gpus_pods_pending_and_charts_live(role_all: RoleAll, browser_page: BrowserPage,
                                                             tmp_path: Path) -> None:
    _console_args(role_all)
    role_all.start()
    role_all.wait_for("the controller and hypervisor to be ready", role_all.ready, timeout=60)
    banner = role_all.wait_for("the banner", lambda: re.search(r"console\s+(http://\S+)", role_all.output()))
    assert banner.group(1) == role_all.console
    kubectl = Kubectl(role_all.kubeconfig, tmp_path / "kubectl-cache")
    page = browser_page.page

    # the overview names the simulated GPUs and the pool
    page.goto(role_all.console + "/")
    page.get_by_role("heading", name="tensor-fusion-shared").wait_for()
    overview = page.inner_text("main")
    assert "NVIDIA A100-SXM4-80GB" in overview and "NVIDIA H100 80GB HBM3" in overview
    browser_page.screenshot("console-overview")

    # a pod created with kubectl shows on its GPU's bar, with no reload of the page
    page.goto(role_all.console + "/gpus")
    page.evaluate("window.__notReloaded = true")
    kubectl("apply", "-f", str(EXAMPLE))
    gpu = role_all.wait_for("my-pod placed on a GPU", lambda: _gpu_of(role_all, "my-pod"), timeout=60)
    placed = time.monotonic()
    card = page.locator(f'li.gpu[data-gpu="{gpu}"]')
    card.get_by_text("default/my-pod").wait_for(timeout=TIMEOUT_MS)
    shown_after_s = time.monotonic() - placed
    assert page.evaluate("window.__notReloaded === true"), "the page reloaded instead of updating in place"
    assert "MEDIUM" in card.inner_text().upper() and "20 TFLOPS" in card.inner_text()
    browser_page.screenshot("console-gpus")

    # an impossible pod is on Pending with the scheduler's suggestion and the kubectl that applies it
    kubectl("apply", "-f", "-", input=IMPOSSIBLE)
    page.goto(role_all.console + "/pending")
    article = page.locator("article.pending", has_text="default/too-big")
    article.get_by_text("What would make it fit").wait_for(timeout=TIMEOUT_MS)
    assert "tflops" in article.inner_text().lower()
    command = article.locator("code").first.inner_text()
    assert command.startswith("kubectl annotate pod -n default too-big tensor-fusion.ai/tflops-request="), command
    browser_page.screenshot("console-pending")

    # a chart has data once the recorders have ticked (the page's own polling brings it in)
    page.goto(role_all.console + "/usage?metric=tflops_requested&group=namespace&window=hour")
    page.locator("figure.chart polyline").first.wait_for(state="attached", timeout=30_000)
    browser_page.screenshot("console-usage")

    for path in ("/workloads", "/quotas", "/events"):
        page.goto(role_all.console + path)
        page.locator("#live").wait_for()
        assert "my-pod" in page.inner_text("main") or path != "/workloads"
        browser_page.screenshot(f"console-{path.strip('/')}")
    page.set_viewport_size({"width": 420, "height": 900})  # a narrow window: the pool cards stack
    page.goto(role_all.console + "/")
    page.get_by_role("heading", name="tensor-fusion-shared").wait_for()
    browser_page.screenshot("console-overview-narrow")
    browser_page.assert_no_errors()
    (browser_page.directory / "console-timings.json").write_text(json.dumps({"pod_shown_after_s": shown_after_s}))


def test_tfusion_console_finds_the_controller_and_refuses_an_open_address_without_a_token(
        role_all_ready: RoleAll, tmp_path: Path) -> None:
    run = role_all_ready
    (port,) = free_ports(1)
    console = subprocess.Popen([sys.executable, "-m", "tfusion", "console", "--kube", str(run.kubeconfig),
                                "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        assert console.stdout is not None
        line = console.stdout.readline().decode()
        assert line.startswith(f"tfusion console: http://127.0.0.1:{port}"), line
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text
        assert "tensor-fusion-shared" in page
        assert "Controller:" not in page, "the console did not find the controller through the leader's ConfigMap"
        assert "Measured use is not shown" not in page
    finally:
        console.terminate()
        assert console.wait(timeout=20) == 0
    refused = subprocess.run([sys.executable, "-m", "tfusion", "console", "--kube", str(run.kubeconfig),
                              "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--token-file" in refused.stderr, refused.stderr
