"""Nodes of one pool kept ordered by score, with bounds that let a search skip what cannot fit.

Node scores are integers 0..100 that do not depend on the request (see scoring.py), so nodes sit in
101 buckets, highest first, each holding its node names sorted. For every node the index keeps the
largest free VRAM and the largest free TFLOPS of any schedulable GPU of the pool on it (-1 when the
node can take nothing, e.g. it has reached its worker limit) and how many schedulable GPUs it has
(0 then); for every bucket an upper bound of those. A search walks buckets from the top, skips a
bucket whose bound is below the request, skips a node whose own maxima are below it, and stops at
the first node that passes the exact check.
Bounds only grow on insert and are tightened when a search scans a whole bucket without success,
so they stay correct (never below the truth) without a rescan on every change. One commit or
release changes one node: `place` moves it between buckets in O(bucket size) C-level list work.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

MAX_SCORE = 100


class PoolIndex:
    """Score-ordered nodes of one pool; `variant` says which node score (used or free) orders them."""

    __slots__ = ("agg_n", "agg_t", "agg_v", "bound_n", "bound_t", "bound_v", "bucket_of", "buckets", "scores",
                 "variant")

    def __init__(self, variant: str) -> None:
        self.variant = variant
        # buckets[0] holds score 100, buckets[100] score 0: iteration order is best first
        self.buckets: list[list[str]] = [[] for _ in range(MAX_SCORE + 1)]
        self.bound_v = [-1] * (MAX_SCORE + 1)
        self.bound_t = [-1] * (MAX_SCORE + 1)
        self.bound_n = [0] * (MAX_SCORE + 1)
        self.bucket_of: dict[str, int] = {}
        self.scores: dict[str, int] = {}  # node -> score, the same facts as bucket_of, for quick lookups
        self.agg_v: dict[str, int] = {}
        self.agg_t: dict[str, int] = {}
        self.agg_n: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.bucket_of)

    def __contains__(self, node: str) -> bool:
        return node in self.bucket_of

    def place(self, node: str, score: int, best_v: int, best_t: int, gpus: int = 1) -> None:
        """Insert or move `node` to `score` with its best free VRAM and TFLOPS and its usable GPUs."""
        slot = MAX_SCORE - score
        old = self.bucket_of.get(node)
        self.agg_v[node] = best_v
        self.agg_t[node] = best_t
        self.agg_n[node] = gpus
        self.scores[node] = score
        if old != slot:
            if old is not None:
                names = self.buckets[old]
                del names[bisect_left(names, node)]
            insort(self.buckets[slot], node)
            self.bucket_of[node] = slot
        if best_v > self.bound_v[slot]:
            self.bound_v[slot] = best_v
        if best_t > self.bound_t[slot]:
            self.bound_t[slot] = best_t
        if gpus > self.bound_n[slot]:
            self.bound_n[slot] = gpus

    def remove(self, node: str) -> None:
        old = self.bucket_of.pop(node, None)
        if old is None:
            return
        names = self.buckets[old]
        del names[bisect_left(names, node)]
        del self.agg_v[node]
        del self.agg_t[node]
        del self.agg_n[node]
        del self.scores[node]

    def score(self, node: str) -> int:
        return MAX_SCORE - self.bucket_of[node]

    def ordered(self) -> Iterator[str]:
        """Every node, best score first, then by name."""
        for names in self.buckets:
            yield from names

    def search(self, need_v: int, need_t: int, fits: Callable[[str], object], *, need_gpus: int = 1) -> object:
        """The first non-None `fits(node)` in score order among nodes whose maxima reach the need."""
        agg_v = self.agg_v
        agg_t = self.agg_t
        agg_n = self.agg_n
        bound_v = self.bound_v
        bound_t = self.bound_t
        bound_n = self.bound_n
        slot = -1
        for names in self.buckets:
            slot += 1
            if not names or bound_v[slot] < need_v or bound_t[slot] < need_t or bound_n[slot] < need_gpus:
                continue
            for node in names:
                if agg_v[node] >= need_v and agg_t[node] >= need_t and agg_n[node] >= need_gpus:
                    found = fits(node)
                    if found is not None:
                        return found
            # a whole bucket scanned without success: its bounds can become exact
            bound_v[slot] = max(map(agg_v.__getitem__, names))
            bound_t[slot] = max(map(agg_t.__getitem__, names))
            bound_n[slot] = max(map(agg_n.__getitem__, names))
        return None
