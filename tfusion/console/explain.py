"""The words for a scheduler explanation: one line per suggestion, and the `kubectl annotate` that
applies one. `tfusion why` prints them and the console shows them.

Why here: the controller renders the explanation (`GET /api/why`: the scheduler's Status, per-node
reasons, suggestions); its clients only put it into words. Two clients writing those words
separately would drift, so both call these.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from tfusion.api.accessors import section


def suggestion_text(suggestion: Mapping[str, Any]) -> str:
    """The suggestion's message and, when it names changes, what to set on what."""
    changes = ", ".join(f"{k}={v!s}" if v else f"remove {k}" for k, v in section(suggestion, "changes").items())
    target = suggestion.get("target") or "annotations"
    how = f" (set {changes} on the {'pod' if target == 'annotations' else target})" if changes else ""
    return f"{suggestion.get('message')}{how}"


def annotate_command(namespace: str, pod: str, suggestion: Mapping[str, Any]) -> str:
    """The `kubectl annotate` that applies an annotations suggestion to the pod ("" for others:
    a quota change or pods to remove are for a person to decide, not a line to paste)."""
    changes = section(suggestion, "changes")
    if (suggestion.get("target") or "annotations") != "annotations" or not changes:
        return ""
    args = [f"{key}={value}" if value else f"{key}-" for key, value in sorted(changes.items())]
    return shlex.join(["kubectl", "annotate", "pod", "-n", namespace, pod, *args, "--overwrite"])


def node_reasons(status: Mapping[str, Any]) -> str:
    """One node's reasons from an explanation's `nodes` entry, as one line."""
    reasons = [r for r in status.get("reasons") or () if isinstance(r, Mapping)]
    return "; ".join(str(r.get("detail") or r.get("message", "")) for r in reasons) or str(status.get("summary", ""))
