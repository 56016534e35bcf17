"""The official `kubernetes` Python client configured from a kubeconfig, for the tests that check
tfusion's API server answers it as kube-apiserver would (the package has no type hints, so its
objects are Any here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import config as kube_config


def official_client(kubeconfig: str | Path) -> Any:
    """An ApiClient of the official `kubernetes` package, configured from `kubeconfig`."""
    return kube_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
