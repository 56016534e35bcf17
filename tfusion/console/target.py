"""How the command-line clients (`tfusion why`, `tfusion console`) read `--kube`: the same way the
roles do (a kubeconfig path, `in-cluster`, or `embedded` for the kubeconfig `--role=all` writes)."""

from __future__ import annotations


def kube_target(kube: str) -> str:
    """What `--kube` names, as `KubeClient.connect` takes it."""
    from tfusion.settings import Settings

    settings = Settings.load({"kube": kube or None}, roles=("controller",))
    mode = settings.kube_mode
    return settings.kubeconfig_out if mode == "embedded" else mode
