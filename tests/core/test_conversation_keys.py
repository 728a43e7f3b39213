"""A conversation addressed by key has one workflow id per (tenant, key), and no two pairs share one:
`conv-{tenant}-key-{key}` would read the same for tenant "a" with key "x-key-y" and tenant "a-key-x"
with key "y", so a tenant whose id holds the separator cannot use keys (a 422 at both doors)."""

from __future__ import annotations

import pytest

from countersign.client.handles import keyed_workflow_id


def test_a_key_reaches_its_tenants_one_conversation() -> None:
    assert keyed_workflow_id("acme", "telegram_5618410820") == "conv-acme-key-telegram_5618410820"
    assert keyed_workflow_id("a", "x-key-y") == "conv-a-key-x-key-y"  # a key may hold it: tenant ids cannot


def test_a_tenant_whose_id_holds_the_separator_cannot_address_by_key() -> None:
    with pytest.raises(ValueError, match="cannot address conversations by key"):
        keyed_workflow_id("a-key-x", "y")
