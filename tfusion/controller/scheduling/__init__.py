"""GPU scheduling around the allocator: extender endpoints, built-in scheduler, simulate-schedule."""
