"""The executor: the one process that calls providers (C12)."""
