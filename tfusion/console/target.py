"""What the command-line clients (`tfusion`, `tfusion why`, `tfusion console`) share: how a mistake
on the command line is reported, and how `--kube` is read — the same way the roles read it (a
kubeconfig path, `in-cluster`, or `embedded` for the kubeconfig `--role=all` writes)."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a mistake as one line (it names the flag) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def kube_target(kube: str) -> str:
    """What `--kube` names, as `KubeClient.connect` takes it."""
    from tfusion.settings import Settings

    settings = Settings.load({"kube": kube or None}, roles=("controller",))
    mode = settings.kube_mode
    return settings.kubeconfig_out if mode == "embedded" else mode
