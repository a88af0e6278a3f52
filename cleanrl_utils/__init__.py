"""Small shared plumbing and tools for the cleanrl scripts."""
