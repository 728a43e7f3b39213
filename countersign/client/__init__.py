"""What the CLI and the server share to act on conversations: start one and find its handle, read an
ended one from the store, change a tenant's tool tiers. Never imported by workflows or activities."""
