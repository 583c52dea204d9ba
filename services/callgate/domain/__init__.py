"""The domain: events, catalog, policy, identity, approvals and the rules they share (no I/O)."""
