"""The console's web app: server-rendered pages over the cluster cache and the leader's answers.

Why server-rendered with a few lines of our own JavaScript: nothing to build, nothing fetched from
the internet, every page readable without scripts, and the numbers computed once in Python
(console/views.py). Live updates: each page's script asks for the page's live fragment about once a
second with the fingerprint of what it shows (`?fragment=1&since=<etag>`); the server answers 204
when nothing changed, else the new fragment, which replaces the old one in place (no reload).

A console bound beyond loopback needs its token: `Authorization: Bearer <token>`, or once
`?token=<token>` (which sets an HttpOnly cookie and redirects to the page without it).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any
from urllib.parse import urlencode

import jinja2
from litestar import Litestar, Request, Response, get
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.params import Parameter

from tfusion.console import views
from tfusion.console.cache import Cluster
from tfusion.console.charts import render_chart
from tfusion.console.controller_link import ControllerLink
from tfusion.console.history import WINDOWS, GroupBy, HistoryError, HistorySource, Metric
from tfusion.web.app import make_app
from tfusion.web.errors import HttpError

TOKEN_COOKIE = "tfusion_console_token"
PAGES = (("/", "Overview"), ("/gpus", "GPUs"), ("/workloads", "Workloads"), ("/pending", "Pending"),
         ("/quotas", "Quotas"), ("/events", "Events"), ("/usage", "Usage and cost"))
METRICS: dict[str, tuple[str, str]] = {"cost": ("Cost", "money"), "tflops_used": ("TFLOPS used", "tflops"),
                                       "tflops_requested": ("TFLOPS requested", "tflops"),
                                       "vram_used": ("VRAM used", "bytes")}
GROUPS = ("namespace", "pool", "workload")
SORTS: dict[str, views.WorkloadSort] = {"waste": "waste", "cost": "cost", "name": "name"}


@dataclass
class ConsoleState:
    """What every page reads."""

    cluster: Cluster
    controller: ControllerLink | None
    history: HistorySource | None
    controller_error: str = ""

    async def usage(self) -> views.Usage:
        if self.controller is None:
            return views.Usage(error=self.controller_error or "no controller to ask for usage")
        return await self.controller.usage()


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("tfusion.console", "templates"),
                             autoescape=jinja2.select_autoescape(default=True), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters.update(bytes=views.format_bytes, tflops=views.format_tflops, money=views.format_money)
    env.globals.update(pages=PAGES, qos_levels=views.QOS_LEVELS, tflops_filter=views.format_tflops,
                       bytes_filter=views.format_bytes)
    return env


def _static(name: str) -> bytes:
    return resources.files("tfusion.console").joinpath("static", name).read_bytes()


def console_app(cluster: Cluster, *, controller: ControllerLink | None, history: HistorySource | None,
                token: str = "", poll_ms: int = 1000, controller_error: str = "") -> Litestar:
    """The console app (see the module docstring)."""
    state = ConsoleState(cluster, controller, history, controller_error)
    env = _environment()
    assets = {"console.css": (_static("console.css"), "text/css; charset=utf-8"),
              "console.js": (_static("console.js"), "text/javascript; charset=utf-8"),
              "favicon.svg": (_static("favicon.svg"), "image/svg+xml")}

    #: path -> what its last render was made from, and its fingerprint: an unchanged poll is not rendered
    rendered: dict[str, tuple[Any, ...]] = {}

    def source_key(source: tuple[Any, ...], etag: str) -> tuple[Any, ...]:
        query = "&".join(p for p in str(source[2]).split("&") if not p.startswith(("since=", "fragment=")))
        return (source[0], source[1], query, etag)

    def page(template: str, title: str, path: str, build: Callable[[Request[Any, Any, Any]], Awaitable[dict[str, Any]]]
             ) -> Callable[[Request[Any, Any, Any]], Awaitable[Response[bytes]]]:
        live = env.get_template(f"{template}.html")

        async def handler(request: Request[Any, Any, Any]) -> Response[bytes]:
            since = request.query_params.get("since")
            await state.usage()  # refreshed first, so the source below says whether it changed
            source = (cluster.generation, state.controller.usage_version if state.controller else 0,
                      request.url.query)
            if template != "pending" and since and rendered.get(path) == (source_key(source, since)):
                return Response(b"", status_code=204, headers={"ETag": since})
            context = await build(request)
            fragment = live.render(context, fragment=True).encode()
            etag = hashlib.blake2s(fragment, digest_size=8).hexdigest()
            rendered[path] = source_key(source, etag)
            if request.query_params.get("fragment"):
                if since == etag:
                    return Response(b"", status_code=204, headers={"ETag": etag})
                return _html(fragment, etag)
            body = env.get_template("page.html").render(
                title=title, path=path, live=fragment.decode(), etag=etag, poll_ms=poll_ms,
                controller=state.controller.url if state.controller else "",
                controller_error=state.controller_error, problems=cluster.problems(),
                query=urlencode([(k, v) for k, v in request.query_params.items() if k not in ("fragment", "since")]))
            return _html(body.encode(), etag)

        return handler

    async def overview_context(_: Request[Any, Any, Any]) -> dict[str, Any]:
        return {"view": views.overview(cluster, await state.usage())}

    async def gpus_context(request: Request[Any, Any, Any]) -> dict[str, Any]:
        q = request.query_params
        filters = views.GpuFilters(q.get("pool", ""), q.get("model", ""), q.get("node", ""), _int(q.get("page"), 1))
        return {"view": views.gpu_page(cluster, await state.usage(), filters)}

    async def workloads_context(request: Request[Any, Any, Any]) -> dict[str, Any]:
        sort = request.query_params.get("sort", "waste")
        if sort not in SORTS:
            raise HttpError(400, f"sort: {sort!r} is not allowed; expected waste, cost or name")
        return {"view": views.workload_page(cluster, await state.usage(), SORTS[sort])}

    async def pending_context(_: Request[Any, Any, Any]) -> dict[str, Any]:
        pods = views.pending_pods(cluster)
        shown = pods[:50]
        keys = [f"{p.namespace or 'default'}/{p.name}" for p in shown]
        if state.controller is not None:
            answers, error = await state.controller.explanations(keys)
        else:
            answers, error = {}, state.controller_error or "no controller to ask for explanations"
        return {"view": views.pending_page(shown, answers, len(pods), error)}

    async def quotas_context(_: Request[Any, Any, Any]) -> dict[str, Any]:
        return {"rows": views.quota_rows(cluster)}

    async def events_context(request: Request[Any, Any, Any]) -> dict[str, Any]:
        q = request.query_params
        kind = q.get("type", "")
        if kind not in ("", "Normal", "Warning"):
            raise HttpError(400, f"type: {kind!r} is not allowed; expected Normal, Warning or nothing")
        return {"view": views.event_page(cluster, views.EventFilters(kind, q.get("kind", ""), q.get("q", "")[:200]))}

    async def usage_context(request: Request[Any, Any, Any]) -> dict[str, Any]:
        q = request.query_params
        metric, group, window = q.get("metric", "cost"), q.get("group", "namespace"), q.get("window", "day")
        for name, value, allowed in (("metric", metric, tuple(METRICS)), ("group", group, GROUPS),
                                     ("window", window, tuple(WINDOWS))):
            if value not in allowed:
                raise HttpError(400, f"{name}: {value!r} is not allowed; expected one of {', '.join(allowed)}")
        chart, error = "", ""
        if state.history is None:
            error = "no metrics source is configured (--metrics-dir or --prometheus)"
        else:
            span, step = WINDOWS[window]
            now = time.time()
            try:
                found = await state.history.query(_metric(metric), _group(group), now - span, now, step)
                chart = render_chart(found, unit=METRICS[metric][1])
            except HistoryError as exc:
                error = str(exc)
        return {"metric": metric, "group": group, "window": window, "metrics": METRICS, "groups": GROUPS,
                "windows": tuple(WINDOWS), "chart": chart, "error": error,
                "source": state.history.name if state.history else ""}

    handlers: list[Any] = []
    for path, template, title, build in (
            ("/", "overview", "Overview", overview_context), ("/gpus", "gpus", "GPUs", gpus_context),
            ("/workloads", "workloads", "Workloads", workloads_context),
            ("/pending", "pending", "Pending pods", pending_context), ("/quotas", "quotas", "Quotas", quotas_context),
            ("/events", "events", "Events", events_context), ("/usage", "usage", "Usage and cost", usage_context)):
        handlers.append(get(path, name=template, include_in_schema=False)(
            page(template, title, path, build)))

    @get("/static/{name:str}", include_in_schema=False, sync_to_thread=False)
    def static(name: Annotated[str, Parameter(max_length=64)]) -> Response[bytes]:
        found = assets.get(name)
        if found is None:
            raise HttpError(404, f"no static file {name!r}")
        return Response(found[0], media_type=found[1], headers={"Cache-Control": "max-age=300"})

    handlers.append(static)
    guards = [_token_guard(token)] if token else []
    return make_app(handlers, title="tfusion console", guards=guards)


def _metric(value: str) -> Metric:
    assert value in METRICS
    return value  # type: ignore[return-value]


def _group(value: str) -> GroupBy:
    assert value in GROUPS
    return value  # type: ignore[return-value]


def _int(text: str | None, default: int) -> int:
    if not text:
        return default
    if not text.isdigit() or len(text) > 6:
        raise HttpError(400, f"page: {text!r} is not allowed; expected a positive whole number")
    return int(text)


def _html(body: bytes, etag: str) -> Response[bytes]:
    return Response(body, media_type="text/html; charset=utf-8", headers={
        "ETag": etag, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                                   "script-src 'self'; frame-ancestors 'none'",
        "Referrer-Policy": "no-referrer"})


def _token_guard(token: str) -> Callable[[ASGIConnection[Any, Any, Any, Any], BaseRouteHandler], None]:
    def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        given = connection.cookies.get(TOKEN_COOKIE, "")
        header = connection.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            given = header[7:].strip()
        query = connection.query_params.get("token")
        if query is not None:
            given = query
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            raise HttpError(401, "this console needs its token: open it with ?token=<the token in --token-file>, "
                                 "or send Authorization: Bearer <token>")
        if query is not None:  # remember it in a cookie and drop it from the address bar
            rest = urlencode([(k, v) for k, v in connection.query_params.items() if k != "token"])
            location = connection.url.path + (f"?{rest}" if rest else "")
            raise HttpError(303, "token accepted", headers={
                "Location": location,
                "Set-Cookie": f"{TOKEN_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"})
    return guard
