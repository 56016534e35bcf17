"""Issue 23's hostile probe of the HTTP edge, measured: one `tfusion --role=all --scheduler=extender`
process, attacked with

- ten limit-sized kube-scheduler extender bodies at once (`ExtenderArgs` with the NodeList of
  `extender_sizing.sample_node`s that fills EXTENDER_MAX_BODY_BYTES, a pod asking for no GPUs,
  half to /scheduler/filter and half to /scheduler/prioritize), then the same ten again;
- request heads and bodies beyond the limits: three 512 MiB headers, a 100 KB URL, 64 MiB bodies
  declared by Content-Length and sent chunked, each to the controller and the API server;

while /healthz of the controller, its probe port and the API server are polled every 5 ms from
other threads. Prints one JSON object: the answers, the worst /healthz round trip (goal < 100 ms),
whether the controller kept its Lease (no "could not renew" in its log, `tfusion_leader` 1), and
the process's RSS before, at its peak, and 30 s after the attack ended (goal: within 20 % of before).

    .venv/bin/python benchmarks/hostile_edge.py [--settle 30]
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from _processes import role_all

from tfusion.controller.scheduling.extender_sizing import sample_node
from tfusion.controller.scheduling.http import EXTENDER_MAX_BODY_BYTES

MiB = 1024 * 1024


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def limit_sized_body() -> tuple[bytes, int]:
    """An ExtenderArgs as large as the extender routes take, and its node count."""
    pod = {"metadata": {"name": "plain", "namespace": "default", "uid": "u-plain"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    envelope = len(orjson.dumps({"Pod": pod, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": []}}))
    item = len(orjson.dumps(sample_node("gpu-node-00000"))) + 1
    count = (EXTENDER_MAX_BODY_BYTES - envelope) // item
    nodes = [sample_node(f"gpu-node-{i:05d}") for i in range(count)]
    body = orjson.dumps({"Pod": pod, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": nodes}})
    assert len(body) <= EXTENDER_MAX_BODY_BYTES, len(body)
    return body, count


class Poller:
    """Polls GET /healthz every 5 ms on one kept-alive connection; keeps the worst round trip."""

    def __init__(self, url: str, verify: Any) -> None:
        self.url, self.verify = url, verify
        self.worst_ms = 0.0
        self.samples = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, verify=self.verify, timeout=60) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    status = client.get("/healthz").status_code
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                self.worst_ms = max(self.worst_ms, (time.perf_counter() - started) * 1000)
                self.samples += 1
                if status != 200:
                    self.failures.append(f"status {status}")
                time.sleep(0.005)


def peak_sampler(pid: int, stop: threading.Event, peak: list[float]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_mb(pid))
        time.sleep(0.05)


def raw_exchange(host: str, port: int, request: Callable[[socket.socket], None], *, tls: ssl.SSLContext | None = None,
                 timeout: float = 60) -> bytes:
    """Send with `request`, then read the answer: until its head and Content-Length body are in,
    or the server closes (a refusal that closes, or one without a length)."""
    with socket.create_connection((host, port), timeout=timeout) as plain:
        sock = tls.wrap_socket(plain, server_hostname=host) if tls else plain
        try:
            request(sock)
        except OSError:
            pass  # the server refused and closed while we were still sending: read its answer
        received = b""
        try:
            while not _complete(received) and (chunk := sock.recv(65536)):
                received += chunk
        except OSError:
            pass
        return received


def _complete(answer: bytes) -> bool:
    """The answer's head has arrived and as much body as its Content-Length says (a keep-alive
    server answers and then waits for the next request, so reading until close would time its
    keep-alive, not its answer)."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return len(body) >= int(value.strip())
    return False


def status_of(answer: bytes) -> int:
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def post_raw(port: int, path: str, body: bytes) -> tuple[int, float]:
    """POST `body` on a plain socket and read the whole answer: sendall and recv release the GIL, so
    the senders cost the /healthz pollers of this benchmark nothing (httpx's response parsing of
    ten 32 MiB answers would hold this process's GIL for seconds and inflate their round trips)."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
        sock.sendall(body)
        first = sock.recv(65536)
        while sock.recv_into(bytearray(1 << 20)):
            pass
    return status_of(first), round(time.perf_counter() - started, 2)


def extender_round(port: int, body: bytes) -> list[tuple[int, float]]:
    results: list[tuple[int, float]] = [(0, 0.0)] * 10

    def post(index: int) -> None:
        results[index] = post_raw(port, "/scheduler/filter" if index % 2 else "/scheduler/prioritize", body)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def concurrently(count: int, call: Callable[[], bytes]) -> list[bytes]:
    results: list[bytes] = [b""] * count

    def run(index: int) -> None:
        results[index] = call()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def head_and_body_attacks(where: dict[str, Any]) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    targets = {"controller": ("/scheduler/filter", None), "api": ("/api/v1/namespaces/default/configmaps",
                                                                  where["verify"])}
    for server, (path, tls) in targets.items():
        port = where["ports"][server]

        def huge_header(sock: socket.socket, path: str = path) -> None:
            sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nx-big: ".encode())
            piece = b"a" * MiB
            for _ in range(512):
                sock.sendall(piece)

        def long_url(sock: socket.socket, path: str = path) -> None:
            sock.sendall(f"GET {path}?q={'a' * 100_000} HTTP/1.1\r\nhost: x\r\n\r\n".encode())

        def declared_body(sock: socket.socket, path: str = path) -> None:
            sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         f"content-length: {64 * MiB}\r\n\r\n".encode())
            piece = b" " * MiB
            for _ in range(64):
                sock.sendall(piece)

        def chunked_body(sock: socket.socket, path: str = path) -> None:
            sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         f"transfer-encoding: chunked\r\n\r\n".encode())
            piece = b"%x\r\n" % MiB + b" " * MiB + b"\r\n"
            for _ in range(64):
                sock.sendall(piece)
            sock.sendall(b"0\r\n\r\n")

        for name, attack, count in (("512 MiB header", huge_header, 3), ("100 KB URL", long_url, 1),
                                    ("64 MiB body by Content-Length", declared_body, 1),
                                    ("64 MiB chunked body", chunked_body, 1)):
            started = time.perf_counter()
            results = concurrently(count, lambda attack=attack, port=port, tls=tls: raw_exchange(  # type: ignore[misc]
                "127.0.0.1", port, attack, tls=tls))
            answers[f"{server}: {name}"] = {"statuses": [status_of(answer) for answer in results],
                                            "s": round(time.perf_counter() - started, 2)}
    return answers


def leader_gauge(base: str) -> str:
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith("tfusion_leader "):
            return line.split()[1]
    return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", type=float, default=30.0, help="seconds after the attack before RSS is read")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds after ready before the attack")
    args = parser.parse_args()
    body, nodes = limit_sized_body()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "tfusion.log"
        with log.open("wb") as stderr, role_all(Path(tmp), "--scheduler=extender", stderr=stderr) as where:
            proc = where["proc"]
            time.sleep(args.warmup)  # start-up settles (CRDs and their CEL rules compiled, informers, reconciles)
            before = rss_mb(proc.pid)
            peak = [before]
            stop = threading.Event()
            sampler = threading.Thread(target=peak_sampler, args=(proc.pid, stop, peak), daemon=True)
            sampler.start()
            pollers = {name: Poller(where[name], where["verify"] if name == "api" else True)
                       for name in ("controller", "probes", "api")}
            for poller in pollers.values():
                poller.__enter__()
            worst_by_phase: dict[str, dict[str, float]] = {}

            def phase_worst(phase: str) -> None:
                worst_by_phase[phase] = {name: round(p.worst_ms, 1) for name, p in pollers.items()}
                for poller in pollers.values():
                    poller.worst_ms = 0.0

            try:
                time.sleep(3)
                phase_worst("quiet, before the attack")
                rounds = []
                for round_ in range(2):
                    rounds.append(extender_round(where["ports"]["controller"], body))
                    phase_worst(f"extender round {round_ + 1}")
                attacks = head_and_body_attacks(where)
                phase_worst("heads and bodies")
            finally:
                for poller in pollers.values():
                    poller.__exit__()
                ended = time.monotonic()
            time.sleep(max(0.0, args.settle - (time.monotonic() - ended)))
            stop.set()
            sampler.join()
            after = rss_mb(proc.pid)
            lease_lost = "could not renew" in log.read_text(errors="replace")
            result = {
                "benchmark": "hostile_edge", "extender_body_bytes": len(body), "extender_body_nodes": nodes,
                "extender_rounds": [[{"status": s, "s": t} for s, t in r] for r in rounds],
                "attacks": attacks,
                "healthz_worst_ms": {name: max(phase[name] for label, phase in worst_by_phase.items()
                                               if not label.startswith("quiet")) for name in pollers},
                "healthz_worst_ms_by_phase": worst_by_phase,
                "healthz_samples": {name: p.samples for name, p in pollers.items()},
                "healthz_failures": {name: p.failures[:3] for name, p in pollers.items() if p.failures},
                "healthz_goal_ms": 100,
                "lease_lost": lease_lost, "tfusion_leader": leader_gauge(where["controller"]),
                "rss_mb": {"before": round(before, 1), "peak": round(peak[0], 1), "after": round(after, 1),
                           "settle_s": args.settle},
                "rss_after_within_20_percent": after <= before * 1.2,
            }
            print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
