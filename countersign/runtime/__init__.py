"""Process plumbing every Countersign process shares: settings, logging, the Temporal data converter
and client, search attributes, a circuit breaker. Imports only `countersign.core`."""
