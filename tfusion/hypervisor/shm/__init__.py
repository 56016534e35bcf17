"""The soft limiter's shared memory: the V2 byte layout (`layout`), atomic field access (`atomics`,
`state`) and the files' paths and lifecycle (`store`)."""

from tfusion.hypervisor.shm.state import DeviceConfig, SharedState, ShmError, ShmLockTimeout
from tfusion.hypervisor.shm.store import DEFAULT_ROOT, ShmOwner, ShmPathError, ShmStore

__all__ = ["DEFAULT_ROOT", "DeviceConfig", "SharedState", "ShmError", "ShmLockTimeout", "ShmOwner", "ShmPathError",
           "ShmStore"]
