"""The MCP surface (``callgate mcp``): agents reach their tools through callgate.

``server`` translates ``tools/list`` and ``tools/call`` to the SDK Gateway, ``bridge``
runs the gateway on its own thread, ``serve`` speaks stdio and streamable HTTP and
``draft`` writes catalog entries from an upstream's ``tools/list``. The upstream side is a
provider (``callgate.providers.mcp``), called by the executor like any other.
"""
