"""Embedded API server throughput and latency, over real HTTP, printed as ONE JSON object.

Starts `tfusion --role=apiserver` in a child process (its own core, a fresh state file), then drives it
from this process with many concurrent keep-alive connections (a minimal HTTP/1.1 client, so the
client's own cost does not hide the server's), over HTTPS with the kubeconfig's bearer token, as
every client of the server talks to it:

- creates_per_s: ConfigMap creates per second with `--clients` concurrent connections;
- patch_p99_ms: p99 latency of merge patches with `--clients` concurrent patchers;
- watch_lag_p99_ms: time from sending a patch to the matching event arriving at a watcher, measured
  while the concurrent patch load runs. The commit happens somewhere inside that window, so this is
  an upper bound on the true lag (it includes the request's own queueing under load);
- watch_lag_after_response_p99_ms: counted from the patch's response instead (0 when the event
  arrives first: the server sends the event and the response in the same step, once committed).

Usage: python benchmarks/apiserver.py [--clients 32] [--creates 6000] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _processes import stop

NS_PATH = "/api/v1/namespaces/default/configmaps"


class Server:
    """Where the server is and how to talk to it (from the kubeconfig it wrote)."""

    def __init__(self, host: str, port: int, token: str, tls: ssl.SSLContext) -> None:
        self.host, self.port, self.token, self.tls = host, port, token, tls


class Connection:
    """One keep-alive HTTP/1.1 connection over TLS; requests are sequential on it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.host = server.host
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.server.host, self.server.port,
                                                                 ssl=self.server.tls)
        return self

    async def request(
        self, method: str, path: str, body: bytes = b"", content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: {content_type}\r\n"
            f"Authorization: Bearer {self.server.token}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], Server]:
    kubeconfig = workdir / "kubeconfig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfusion",
            "--role=apiserver",
            "--apiserver-listen",
            "127.0.0.1:0",
            "--state",
            str(workdir / "state.db"),
            "--kubeconfig-out",
            str(kubeconfig),
            "--log-level",
            "warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"apiserver did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.05)
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    host, port = cluster["server"].split("//")[1].rsplit(":", 1)
    tls = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    return proc, Server(host, int(port), config["users"][0]["user"]["token"], tls)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


async def creates(server: Server, clients: int, total: int) -> float:
    connections = [await Connection(server).open() for _ in range(clients)]
    counter = iter(range(total))

    async def worker(conn: Connection) -> None:
        for i in counter:
            body = json.dumps(
                {"metadata": {"name": f"cm-{i}", "labels": {"bench": "yes"}}, "data": {"k": "v" * 64}}
            ).encode()
            status, _ = await conn.request("POST", NS_PATH, body)
            assert status == 201, status

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in connections))
    elapsed = time.perf_counter() - started
    for conn in connections:
        conn.close()
    return total / elapsed


async def patches_with_watch(server: Server, clients: int, objects: int, seconds: float) -> dict[str, Any]:
    host = server.host
    arrivals: dict[str, float] = {}
    ready = asyncio.Event()

    async def watcher() -> None:
        reader, writer = await asyncio.open_connection(host, server.port, ssl=server.tls)
        status_rv = await list_rv()
        writer.write(f"GET {NS_PATH}?watch=true&resourceVersion={status_rv} HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: Bearer {server.token}\r\n\r\n".encode())
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        ready.set()
        buffer = b""
        try:
            while True:
                size_line = await reader.readline()
                size = int(size_line.strip() or b"0", 16)
                chunk = await reader.readexactly(size + 2)
                now = time.perf_counter()
                buffer += chunk[:-2]
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line:
                        event = json.loads(line)
                        arrivals[event["object"]["metadata"]["resourceVersion"]] = now
        finally:
            writer.close()

    async def list_rv() -> str:
        conn = await Connection(server).open()
        _, body = await conn.request("GET", f"{NS_PATH}?limit=1")
        conn.close()
        return str(json.loads(body)["metadata"]["resourceVersion"])

    watch_task = asyncio.ensure_future(watcher())
    await ready.wait()
    latencies: list[float] = []
    responded: dict[str, float] = {}
    requested: dict[str, float] = {}
    deadline = time.perf_counter() + seconds
    connections = [await Connection(server).open() for _ in range(clients)]

    async def patcher(index: int, conn: Connection) -> None:
        n = 0
        while time.perf_counter() < deadline:
            name = f"cm-{(index + n * clients) % objects}"
            n += 1
            body = json.dumps({"data": {"k": f"{index}-{n}"}}).encode()
            started = time.perf_counter()
            status, answer = await conn.request("PATCH", f"{NS_PATH}/{name}", body, "application/merge-patch+json")
            done = time.perf_counter()
            assert status == 200, (status, answer[:200])
            latencies.append(done - started)
            rv = json.loads(answer)["metadata"]["resourceVersion"]
            responded[rv] = done
            requested[rv] = started

    await asyncio.gather(*(patcher(i, c) for i, c in enumerate(connections)))
    await asyncio.sleep(0.5)  # let the last events arrive
    watch_task.cancel()
    for conn in connections:
        conn.close()
    lags = [arrivals[rv] - t for rv, t in requested.items() if rv in arrivals]
    # an event that arrives before the writer has read its response counts as zero here
    after_response = [max(0.0, arrivals[rv] - t) for rv, t in responded.items() if rv in arrivals]
    missing = len(responded) - len(lags)
    return {
        "patches_per_s": round(len(latencies) / seconds, 1),
        "patch_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "patch_p99_ms": round(p99(latencies) * 1000, 2),
        "watch_lag_p50_ms": round(statistics.median(lags) * 1000, 2) if lags else None,
        "watch_lag_p99_ms": round(p99(lags) * 1000, 2) if lags else None,
        "watch_lag_after_response_p99_ms": round(p99(after_response) * 1000, 2) if after_response else None,
        "watch_events_missing": missing,
    }


async def main_async(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    result: dict[str, Any] = {"clients": args.clients, "creates": args.creates}
    result["creates_per_s"] = round(await creates(server, args.clients, args.creates), 1)
    result.update(await patches_with_watch(server, args.clients, args.creates, args.seconds))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--creates", type=int, default=6000)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, server = start_server(Path(tmp))
        try:
            result = asyncio.run(main_async(args, server))
        finally:
            stop(proc)
    result["cpu_count"] = os.cpu_count()
    result["note"] = "server in its own process, client in this one, same machine, HTTPS with a bearer token"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
