"""callgate: a tool-call authorization gateway for AI agents (see DESIGN contract C1-C12)."""

__version__ = "0.1.0"
