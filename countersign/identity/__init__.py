"""Who acts: signed, single-use proofs of a person's decision or request (minted by the server,
checked by the worker)."""
