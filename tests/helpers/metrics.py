"""The pool with pricing and the worker pod that the metrics and cost unit tests read."""

from __future__ import annotations

from typing import Any

from tfusion.api import annotations as tfa
from tfusion.api.accessors import GpuPool

POOL = GpuPool({"metadata": {"name": "p"}, "spec": {"qosConfig": {
    "evictionProtectionPriceRatio": "1.5",
    "pricing": [{"qos": "medium", "requests": {"perFP16TFlopsPerHour": "$0.36", "perGBOfVRAMPerHour": "$0.72"},
                 "limitsOverRequests": "0.5"},
                {"qos": "critical", "requests": {"perFP16TFlopsPerHour": "$0.36", "perGBOfVRAMPerHour": "$0.72"}}]}}})


def worker_pod(**notes: str) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns", "uid": "u-1", "creationTimestamp": "2025-01-31T12:00:00Z",
                         "labels": {tfa.COMPONENT: "worker", tfa.WORKLOAD: "wl"},
                         "annotations": {tfa.GPU_POOL: "p", tfa.TFLOPS_REQUEST: "10", tfa.VRAM_REQUEST: "4Gi",
                                         tfa.GPU_IDS: "g1,g2", **notes}},
            "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}
