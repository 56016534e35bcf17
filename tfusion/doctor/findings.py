"""What a check reports, and the two ways it is printed.

A finding is `{check, severity, message, fix}`: severity `ok`, `info` (nothing is wrong, but the user
should know, e.g. a setting of the original TensorFusion that tfusion takes with another behaviour),
`warning` (works, but something is off or could not be checked) or `error` (something is broken);
`fix` says what to do, empty for ok. The exit code is 1 when any finding is an error, else 0, so a
clean switch that only has things to know about is not a failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal, TypeAlias

import orjson

Severity: TypeAlias = Literal["ok", "info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = ("ok", "info", "warning", "error")


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    message: str
    fix: str = ""


def ok(check: str, message: str) -> Finding:
    return Finding(check, "ok", message)


def info(check: str, message: str, fix: str = "") -> Finding:
    return Finding(check, "info", message, fix)


def warning(check: str, message: str, fix: str = "") -> Finding:
    return Finding(check, "warning", message, fix)


def error(check: str, message: str, fix: str) -> Finding:
    return Finding(check, "error", message, fix)


def exit_code(findings: Sequence[Finding]) -> int:
    return 1 if any(f.severity == "error" for f in findings) else 0


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    return {severity: sum(f.severity == severity for f in findings) for severity in SEVERITIES}


def render_json(findings: Sequence[Finding]) -> str:
    body = {"findings": [asdict(f) for f in findings], "summary": summary(findings)}
    return orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n"


_LABELS = {"ok": "ok", "info": "info", "warning": "WARNING", "error": "ERROR"}


def render_text(findings: Sequence[Finding]) -> str:
    """One line per finding (severity, check, message), its fix indented below it, then the counts."""
    width = max((len(f.check) for f in findings), default=0)
    lines = []
    for f in findings:
        lines.append(f"{_LABELS[f.severity]:<7}  {f.check:<{width}}  {f.message}")
        if f.fix:
            lines.append(f"{'':<7}  {'':<{width}}  fix: {f.fix}")
    counts = summary(findings)
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info, "
                 f"{counts['ok']} ok")
    return "\n".join(lines) + "\n"
