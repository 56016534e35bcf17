"""allocator package."""
