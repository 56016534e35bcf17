"""The example.com Widget CRD the API server tests define, written once: each test gives the
openAPIV3Schema it exercises and any extra fields of the served version (subresources, columns)."""

from __future__ import annotations

from typing import Any


def widget_crd(schema: dict[str, Any], **version_extra: Any) -> dict[str, Any]:
    """widgets.example.com/v1, namespaced, served and stored, with `schema` and `version_extra`."""
    version = {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema},
               **version_extra}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [version],
        },
    }
