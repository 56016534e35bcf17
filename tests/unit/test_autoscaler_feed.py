"""The autoscaler feeds each usage sample into its workload's histograms once: history windows overlap
(a point a database ingests late must still be read), so a sample seen before is skipped, and the
VRAM a worker uses now is the most it used over the pass."""

from __future__ import annotations

from tfusion.controller.autoscaler.recommender import WorkloadUsage
from tfusion.controller.autoscaler.service import Autoscaler, Tracked
from tfusion.controller.autoscaler.sources import UsageSample

GIB = 1 << 30


def sample(at: float, worker: str = "w-0", gpu: str = "gpu-a", vram: float = GIB) -> UsageSample:
    return UsageSample(at=at, namespace="default", workload="train", worker=worker, tflops_milli=10_000.0,
                       vram_bytes=vram, gpu=gpu)


def test_overlapping_windows_count_each_sample_once() -> None:
    tracked = Tracked(usage=WorkloadUsage(900.0), half_life_s=900.0)
    first = [sample(100.0), sample(101.0), sample(101.0, gpu="gpu-b")]
    Autoscaler._feed(tracked, first, forget_before=0.0)
    assert tracked.usage.samples == 3
    # the next window reaches back over the first one and brings a point ingested late (101.5) and a new one
    Autoscaler._feed(tracked, [*first, sample(101.5, gpu="gpu-b"), sample(102.0)], forget_before=0.0)
    assert tracked.usage.samples == 5


def test_vram_in_use_is_the_pass_peak_and_old_entries_are_forgotten() -> None:
    tracked = Tracked(usage=WorkloadUsage(900.0), half_life_s=900.0)
    Autoscaler._feed(tracked, [sample(100.0, vram=3 * GIB), sample(101.0, vram=GIB)], forget_before=0.0)
    assert tracked.vram_in_use == {"w-0": 3 * GIB}
    Autoscaler._feed(tracked, [sample(300.0, worker="w-1", vram=GIB)], forget_before=200.0)
    assert tracked.newest == {("w-1", "gpu-a"): 300.0}
    assert tracked.vram_in_use == {"w-0": 3 * GIB, "w-1": GIB}
