"""The kube-scheduler extender routes under hostile and maximal input (issue 23): they are
unauthenticated and take the largest bodies of the controller, so

- with `--scheduler=builtin` they answer 409 before a byte of the body is read (the connection
  is then closed), and a body declared over EXTENDER_MAX_BODY_BYTES is 413 at once;
- a body nested too deep is 400, a mistyped one 400 naming the field, and a NodeList's items come
  back as they were sent;
- ten limit-sized bodies at once (a 5,000-node cluster without nodeCacheCapable, ten times over)
  are answered while /healthz keeps answering (within a bound generous for a busy machine) and the
  controller keeps its Lease; afterwards the process hands the memory back.

The controller runs against the embedded API server; for the load test in a thread of its own, so
that the test's clients do not share its event loop.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import orjson
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds, apply_crds_sync
from tests.helpers import eventually, read_until_closed
from tests.helpers.controller import Controller, controllers, settings_for, start_controller
from tfusion.controller.role import ControllerRole, build_runtime, configure, serve_runtime
from tfusion.controller.scheduling.extender_sizing import sample_node
from tfusion.controller.scheduling.http import EXTENDER_MAX_BODY_BYTES
from tfusion.web import MEMORY_TRIMMER, _resident_bytes

pytestmark = pytest.mark.anyio

MiB = 1024 * 1024
HANG_S = 10.0
#: generous bounds for a busy test machine (the benchmark measures the real figures: < 100 ms)
HEALTHZ_BOUND_S = 2.0
PLAIN_POD = {"metadata": {"name": "plain", "namespace": "default", "uid": "u-plain"},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def send_head_only(port: int, path: str, declared: int, body_start: bytes = b"") -> bytes:
    """POST a head declaring `declared` body bytes and only `body_start` of them; what the server
    answers before it closes the connection (it must not wait for the rest)."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_S) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     f"content-length: {declared}\r\n\r\n".encode() + body_start)
        return read_until_closed(sock, HANG_S)


async def test_builtin_mode_refuses_before_reading_the_body(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with controllers() as tg:
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path))
        port = ctl.runtime.address[1] if ctl.runtime.address else 0
        for path in ("/scheduler/filter", "/scheduler/prioritize", "/scheduler/bind", "/scheduler/preempt"):
            answer = await anyio.to_thread.run_sync(send_head_only, port, path, 30 * MiB, b'{"Pod": {')
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 409"), answer[:300]
            assert b"connection: close" in head.lower(), head
            assert b"--scheduler=extender" in body, body
        # within the limit or not, the mode is what is refused
        over = await anyio.to_thread.run_sync(send_head_only, port, "/scheduler/filter", EXTENDER_MAX_BODY_BYTES + 1)
        assert over.startswith(b"HTTP/1.1 409"), over[:300]
        assert (await ctl.http.get("/healthz")).status_code == 200


async def test_extender_bodies_are_bounded_and_typed(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with controllers() as tg:
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path, scheduler="extender"))
        await eventually(lambda: _allocator_ready(ctl), what="leader ready")
        port = ctl.runtime.address[1] if ctl.runtime.address else 0
        http = ctl.http

        over = await anyio.to_thread.run_sync(send_head_only, port, "/scheduler/filter", EXTENDER_MAX_BODY_BYTES + 1)
        assert over.startswith(b"HTTP/1.1 413"), over[:300]
        assert f"takes at most {EXTENDER_MAX_BODY_BYTES} bytes".encode() in over

        deep = b'{"Pod": {}, "Nodes": {"items": [' + b"[" * 200_000 + b"]" * 200_000 + b"]}}"
        for path in ("/scheduler/filter", "/scheduler/prioritize"):
            refused = await http.post(path, content=deep)
            assert refused.status_code == 400 and "levels deep" in refused.json()["error"], refused.text[:300]
        mistyped = await http.post("/scheduler/filter", json={"Pod": {}, "Nodes": {"items": {"a": 1}}})
        assert mistyped.status_code == 400 and mistyped.json()["field"] == "Nodes.items", mistyped.text
        no_pod = await http.post("/scheduler/prioritize", json={"NodeNames": ["a"]})
        assert no_pod.status_code == 400 and no_pod.json()["field"] == "Pod", no_pod.text
        deep_bind = await http.post("/scheduler/bind", content=b'{"PodName": ' + b"[" * 5000 + b"]" * 5000 + b"}")
        assert deep_bind.status_code == 400 and "levels deep" in deep_bind.json()["error"], deep_bind.text[:300]

        # items come back exactly as sent; an item that names no node is not a candidate
        nodes = [sample_node("n-1"), sample_node("n-2"), 5, {"metadata": {}}]
        node_list = {"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "7"}, "items": nodes}
        answer = (await http.post("/scheduler/filter", json={"Pod": PLAIN_POD, "Nodes": node_list})).json()
        assert answer["Nodes"] == {**node_list, "items": nodes[:2]} and answer["NodeNames"] is None, answer
        scores = (await http.post("/scheduler/prioritize", json={"Pod": PLAIN_POD, "Nodes": node_list})).json()
        assert scores == [{"Host": "n-1", "Score": 0}, {"Host": "n-2", "Score": 0}]


async def _allocator_ready(ctl: Controller) -> bool:
    return ctl.service.allocator is not None


# --- ten limit-sized bodies at once -------------------------------------------------------------------

def limit_sized_body() -> tuple[bytes, int]:
    """An ExtenderArgs as large as the routes take (about 5,670 sample nodes), and its node count."""
    item = len(orjson.dumps(sample_node("gpu-node-00000"))) + 1
    count = (EXTENDER_MAX_BODY_BYTES - 4096) // item
    body = orjson.dumps({"Pod": PLAIN_POD, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": [
        sample_node(f"gpu-node-{i:05d}") for i in range(count)]}})
    assert EXTENDER_MAX_BODY_BYTES - 64 * 1024 < len(body) <= EXTENDER_MAX_BODY_BYTES
    return body, count


async def _serve_controller(runtime: ControllerRole, *, task_status: Any) -> None:
    async with anyio.create_task_group() as tg:
        served = await tg.start(serve_runtime, runtime)
        task_status.started(served)
        await anyio.sleep_forever()


@pytest.fixture
def extender_controller(apiserver: ApiServerHandle, tmp_path: Path) -> Iterator[ControllerRole]:
    """A leader-electing controller in extender mode, on an event loop in a thread of its own."""
    apply_crds_sync(apiserver)
    settings = settings_for(apiserver, tmp_path, scheduler="extender", leader_elect=True,
                            leader_lease_duration=8.0, leader_renew_deadline=5.0, leader_retry_period=0.5)
    with anyio.from_thread.start_blocking_portal() as portal:
        runtime = portal.call(build_runtime, settings)
        configure(runtime)
        future, served = portal.start_task(_serve_controller, runtime)
        try:
            deadline = time.monotonic() + 30
            while not (runtime.manager.elector is not None and runtime.manager.elector.is_leader):
                assert time.monotonic() < deadline, "the controller did not become leader within 30 s"
                time.sleep(0.05)
            yield served
        finally:
            future.cancel()


def test_ten_limit_sized_bodies_leave_healthz_and_the_lease_alone(extender_controller: ControllerRole) -> None:
    runtime = extender_controller
    assert runtime.address is not None and runtime.manager.elector is not None
    elector = runtime.manager.elector
    port = runtime.address[1]
    base = f"http://127.0.0.1:{port}"
    body, nodes = limit_sized_body()
    resident_before = _resident_bytes()
    trims_before = MEMORY_TRIMMER.trims
    done = threading.Event()
    worst = [0.0]
    lost: list[str] = []

    def poll() -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            while not done.is_set():
                started = time.monotonic()
                assert http.get("/healthz").status_code == 200
                worst[0] = max(worst[0], time.monotonic() - started)
                if not elector.is_leader:
                    lost.append(f"not leader at {time.monotonic():.1f}")
                time.sleep(0.005)

    answers: list[tuple[int, int]] = [(0, 0)] * 10

    def post(index: int) -> None:
        """On a plain socket: the senders, in this process beside the controller, must not hold
        the GIL long (httpx parsing a 32 MiB answer would), or they would slow its event loop."""
        path = "/scheduler/prioritize" if index % 2 else "/scheduler/filter"
        with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
            sock.sendall(body)
            received = bytearray()
            while chunk := sock.recv(1 << 20):
                received += chunk
        head, _, answer = bytes(received).partition(b"\r\n\r\n")
        # prioritize: one {"Host", "Score"} per node; filter: each passing node whole
        hosts = answer.count(b'"Host":') if index % 2 else answer.count(b'"providerID":')
        answers[index] = (int(head.split()[1]), hosts)

    poller = threading.Thread(target=poll)
    poller.start()
    senders = [threading.Thread(target=post, args=(i,)) for i in range(10)]
    try:
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
    finally:
        done.set()
        poller.join()
    assert answers == [(200, nodes)] * 10, answers
    assert worst[0] < HEALTHZ_BOUND_S, f"a /healthz took {worst[0]:.2f} s while the bodies were parsed"
    assert not lost and elector.is_leader and elector.observed_holder == elector.identity, lost

    # the memory of the bodies goes back to the system (a bound generous for a test process that
    # also built and sent them; the benchmark measures the real figure)
    deadline = time.monotonic() + 30
    while MEMORY_TRIMMER.trims == trims_before or _resident_bytes() > resident_before + 200 * MiB:
        assert time.monotonic() < deadline, (MEMORY_TRIMMER.trims, trims_before, _resident_bytes() / MiB,
                                             resident_before / MiB)
        time.sleep(0.2)
