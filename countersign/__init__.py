"""Countersign: AI agents acting on a business's data through tools, durably and safely, on Temporal."""
