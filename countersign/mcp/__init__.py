"""MCP servers' tools under Countersign's gates: registry (`servers`), pure catalog rules
(`catalog`), and the worker's connection pool (`pool`). Only `pool` imports the MCP SDK."""
