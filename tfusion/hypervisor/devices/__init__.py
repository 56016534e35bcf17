"""hypervisor/devices package."""
