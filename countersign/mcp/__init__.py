"""MCP servers' tools under Countersign's gates: registry (`servers`), pure catalog rules
(`catalog`), the worker's connection pool (`pool`), and what a conversation is offered
(`snapshot`). Only `pool` imports the MCP SDK."""
