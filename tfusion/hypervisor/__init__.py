"""hypervisor package."""
