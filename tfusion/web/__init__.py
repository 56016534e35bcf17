"""Shared HTTP plumbing for the controller, the hypervisor and the embedded API server, one job a
module; importers take every name from `tfusion.web` itself:

- `server`: the uvicorn server (`serve`, `bind_socket`) with its bounds on each request head and
  the wording of what its HTTP parser refuses;
- `memory`: `MemoryTrimmer`, freed heap memory back to the system after large bodies;
- `errors`: the one error contract of the controller's and the hypervisor's edge (`ErrorBody`,
  `HttpError`, the exception handlers, the OpenAPI error documents);
- `bodies`: request bodies read within their route's limit and deadline, decoded off the event loop
  when large, and large answers (`json_answer`);
- `depth`: `json_depth_problem`, the scan that refuses JSON nested too deep;
- `app`: `make_app`, with health/readiness, /metrics and integer parameters as Go reads them.
"""

from tfusion.web.app import Readiness, health_handlers, make_app, metrics_handler, parse_go_int
from tfusion.web.bodies import (
    DEFAULT_MAX_BODY_BYTES,
    BodyBuffer,
    decode_body,
    decode_json_body,
    json_answer,
    read_body,
    receive_body,
)
from tfusion.web.depth import json_depth_problem
from tfusion.web.errors import EXCEPTION_HANDLERS, ErrorBody, HttpError, error_responses, raw_body
from tfusion.web.memory import MEMORY_TRIMMER, _resident_bytes
from tfusion.web.server import (
    MAX_HEAD_BYTES,
    MAX_URL_BYTES,
    Server,
    _with_head_timeout,
    bind_socket,
    kube_status_refusal,
    serve,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "EXCEPTION_HANDLERS",
    "MAX_HEAD_BYTES",
    "MAX_URL_BYTES",
    "MEMORY_TRIMMER",
    "BodyBuffer",
    "ErrorBody",
    "HttpError",
    "Readiness",
    "Server",
    "_resident_bytes",
    "_with_head_timeout",
    "bind_socket",
    "decode_body",
    "decode_json_body",
    "error_responses",
    "health_handlers",
    "json_answer",
    "json_depth_problem",
    "kube_status_refusal",
    "make_app",
    "metrics_handler",
    "parse_go_int",
    "raw_body",
    "read_body",
    "receive_body",
    "serve",
]
