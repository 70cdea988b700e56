"""Echo's MCP investigation surface: fleet.cluster.* tools over the store, stdio and streamable HTTP."""
