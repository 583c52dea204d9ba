"""callgate: a tool-call authorization gateway for AI agents (the contract: docs/contract.md)."""

__version__ = "0.1.0"
