"""The device-plugin index handshake: a pod's index 1..128 as one of 16 extended resources and a count.

Why it exists: the webhook writes a pod's index as a request for c units of `<domain>/index_<k>`, the
scheduler reads it back to keep indexes unique per node, and the hypervisor's device plugins decode
it when the kubelet allocates. Encoding and decoding live here, as inverses, so the three agree.
Keys are read from `annotations` at call time, so they follow `set_domain`.
"""

from __future__ import annotations

from tfusion.api import annotations as tfa


def index_resource(k: int) -> str:
    """``<domain>/index_<hex k>``, k in 0..15: one of the hypervisor's dummy device-plugin resources."""
    if not 0 <= k < tfa.INDEX_RESOURCES:
        raise ValueError(f"index resource number {k} is out of range; expected 0 to {tfa.INDEX_RESOURCES - 1}")
    return f"{tfa.INDEX_RESOURCE_PREFIX}{k:x}"


def index_resource_number(resource_name: str) -> int | None:
    """k for ``<domain>/index_<hex k>``; None for any other resource name."""
    if not resource_name.startswith(tfa.INDEX_RESOURCE_PREFIX):
        return None
    digit = resource_name[len(tfa.INDEX_RESOURCE_PREFIX):]
    if len(digit) != 1 or digit not in "0123456789abcdef":
        return None
    return int(digit, 16)


def index_resource_names() -> tuple[str, ...]:
    return tuple(index_resource(k) for k in range(tfa.INDEX_RESOURCES))


def encode_pod_index(n: int) -> tuple[str, int]:
    """Pod index n (1..128) -> (resource ``index_<k>``, count c) with n = 8k + c, c in 1..8.

    The original's webhook used k = n // 8 and c = n % 8 + 1, which its scheduler decodes as
    n + 1 and which makes n = 128 ask for the nonexistent ``index_10``. Here encode and decode
    are inverse: 1 -> (index_0, 1), 8 -> (index_0, 8), 9 -> (index_1, 1), 128 -> (index_f, 8).
    """
    if isinstance(n, bool) or not 1 <= n <= tfa.POD_INDEX_MAX:
        raise ValueError(f"pod index {n!r} is out of range; expected an integer from 1 to {tfa.POD_INDEX_MAX}")
    k, c = divmod(n - 1, tfa.INDEX_SLOTS_PER_RESOURCE)
    return index_resource(k), c + 1


def decode_pod_index(resource_name: str, count: int) -> int:
    """(resource ``index_<k>``, count c) -> pod index 8k + c; the inverse of encode_pod_index."""
    k = index_resource_number(resource_name)
    if k is None:
        raise ValueError(f"resource {resource_name!r} is not an index resource; expected "
                         f"{tfa.INDEX_RESOURCE_PREFIX}0 to {tfa.INDEX_RESOURCE_PREFIX}f")
    if isinstance(count, bool) or not 1 <= count <= tfa.INDEX_SLOTS_PER_RESOURCE:
        raise ValueError(f"resource {resource_name}: count {count!r} is out of range; "
                         f"expected 1 to {tfa.INDEX_SLOTS_PER_RESOURCE}")
    return k * tfa.INDEX_SLOTS_PER_RESOURCE + count
