"""`tfusion console`: serve the web console on this machine, reading the cluster as the user.

Why a subcommand and not a role: it runs where the user is, with the user's kubeconfig (their RBAC
decides what it shows), and it writes nothing. `--role=all` starts the same server (`serve_console`)
beside the roles, with the kubeconfig it wrote and the controller it runs.

Exit codes: 0 stopped by a signal, 1 the cluster cannot be read or the address cannot be bound,
2 bad arguments (a non-loopback address without `--token-file` included).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.abc import TaskStatus

from tfusion.console.app import console_app
from tfusion.console.cache import ClusterCache
from tfusion.console.controller_link import ControllerLink
from tfusion.console.history import HistorySource, file_history, influx_history, prometheus_history
from tfusion.console.target import OneLineParser, kube_target
from tfusion.settings import is_loopback, parse_http_url, parse_listen

log = logging.getLogger(__name__)

PROG = "tfusion console"
DEFAULT_LISTEN = "127.0.0.1:8090"


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description="Serve a read-only web console of tfusion's GPUs, workloads, pending "
                                            "pods, quotas, events, usage and cost.")
    parser.add_argument("--kube", default="", help="API server: a kubeconfig path, 'in-cluster' or 'embedded' "
                                                   "(default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve on (default: {DEFAULT_LISTEN}); "
                                                                 "beyond loopback --token-file is required")
    parser.add_argument("--controller", default="", help="the controller's HTTP API URL (default: found through the "
                                                         "leader's ConfigMap, or a port-forward to its pod)")
    parser.add_argument("--token-file", default="", help="file holding the token a browser must present "
                                                         "(?token=... once, or Authorization: Bearer)")
    parser.add_argument("--metrics-dir", default="", help="the directory of tfusion's metrics files for the usage "
                                                          "and cost charts (default: metrics/ beside an embedded "
                                                          "kubeconfig)")
    parser.add_argument("--prometheus", default="", help="a Prometheus URL that scrapes tfusion, for the charts "
                                                         "(instead of the metrics files)")
    parser.add_argument("--influxdb", default="", help="an InfluxDB 1.x URL tfusion pushes its metrics to, for the "
                                                       "charts (instead of the metrics files)")
    parser.add_argument("--influxdb-database", default="public", help="the InfluxDB database (default: public, "
                                                                      "as --metrics-push-database)")
    return parser


@dataclass(frozen=True)
class ConsoleOptions:
    kube: str
    listen: str = DEFAULT_LISTEN
    controller: str = ""
    token: str = ""
    metrics_dir: str = ""
    prometheus: str = ""
    influxdb: str = ""
    influxdb_database: str = "public"
    operator_namespace: str = "tensor-fusion-sys"


def history_for(options: ConsoleOptions, kubeconfig: str) -> HistorySource | None:
    """The charts' source: Prometheus or InfluxDB when given, else the metrics files (given, or beside an
    embedded kubeconfig), else none."""
    if options.prometheus:
        return prometheus_history(options.prometheus)
    if options.influxdb:
        return influx_history(options.influxdb, options.influxdb_database)
    directory = Path(options.metrics_dir) if options.metrics_dir else Path(kubeconfig).expanduser().parent / "metrics"
    if options.metrics_dir or (kubeconfig and directory.is_dir()):
        return file_history(directory)
    return None


@asynccontextmanager
async def _controller(client: object, options: ConsoleOptions) -> AsyncIterator[tuple[ControllerLink | None, str]]:
    from tfusion.console.locate import ControllerNotFound, locate_controller
    from tfusion.kube.client import KubeClient

    assert isinstance(client, KubeClient)
    try:
        async with locate_controller(client, options.controller, namespace=options.operator_namespace) as found:
            link = ControllerLink(found.url, how=found.how)
            try:
                yield link, ""
            finally:
                await link.aclose()
    except ControllerNotFound as exc:
        yield None, str(exc)


async def serve_console(options: ConsoleOptions, *, task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED
                        ) -> None:
    """Serve until cancelled; reports the console's URL once it serves."""
    from tfusion.kube.client import KubeClient
    from tfusion.web.server import bind_socket, serve

    target = kube_target(options.kube)
    client = await KubeClient.connect(target)
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        stack.push_async_callback(client.close)
        cache = ClusterCache(client)
        await tg.start(cache.run)
        link, error = await stack.enter_async_context(_controller(client, options))
        history = history_for(options, target if target not in ("in-cluster",) else "")
        app = console_app(cache, controller=link, history=history, token=options.token, controller_error=error)
        sock = bind_socket(options.listen)
        host, port = sock.getsockname()[:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        await tg.start(lambda task_status: serve(app, sock, task_status=task_status))
        log.info("console serving on %s (controller: %s; charts: %s)", url,
                 link.url if link else error, history.name if history else "none")
        task_status.started(url)


def check_listen(listen: str, token: str) -> str:
    """"" when `listen` may serve with this token, else why not."""
    try:
        host, _ = parse_listen(listen)
    except ValueError as exc:
        return f"--listen: {exc}"
    if not is_loopback(host or "0.0.0.0") and not token:
        return (f"--listen {listen} is reachable from other machines: give --token-file with a token the browser "
                "must present, or listen on 127.0.0.1")
    return ""


def console_command(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    token = ""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            print(f"{PROG}: --token-file: cannot read {args.token_file}: {exc}", file=sys.stderr)
            return 2
        if len(token) < 16:
            print(f"{PROG}: --token-file: the token must be at least 16 characters", file=sys.stderr)
            return 2
    problem = check_listen(args.listen, token)
    for flag, url in (("--prometheus", args.prometheus), ("--influxdb", args.influxdb)):
        try:
            parse_http_url(url)
        except ValueError as exc:
            problem = problem or f"{flag}: {exc}"
    if args.prometheus and args.influxdb:
        problem = problem or "--prometheus and --influxdb: give one source for the charts, not both"
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    options = ConsoleOptions(args.kube, args.listen, args.controller, token, args.metrics_dir, args.prometheus,
                             args.influxdb, args.influxdb_database)
    return anyio.run(_run, options)


async def _run(options: ConsoleOptions) -> int:
    from tfusion.kube.client import KubeError

    failed = 0
    try:
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_console, options)
            print(f"tfusion console: {url}" + (" (send the token from --token-file: ?token=...)" if options.token
                                               else " (loopback only)"), flush=True)
            await _until_signal()
            tg.cancel_scope.cancel()
    except* (KubeError, OSError, ValueError) as group:
        print(f"{PROG}: {'; '.join(map(str, group.exceptions))}", file=sys.stderr)
        failed = 1
    return failed


async def _until_signal() -> None:
    import signal

    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return
