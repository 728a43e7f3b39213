"""Chat channels' secrets are never in PostgreSQL in plain text: the raw rows hold Fernet tokens,
the application reads the plain values, a wrong key opens nothing, and a key rotates."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from cryptography.fernet import Fernet
from sqlalchemy import delete, text
from sqlalchemy.ext.asyncio import AsyncEngine

from countersign.db import sealed
from countersign.db.channels import ChannelSettings, channel_view, rekey, set_channel
from countersign.db.engine import session_factory
from countersign.db.schema import ChatChannel
from countersign.db.sealed import SealBroken, keys_from

TOKEN = "123456:AAE-plain-bot-token"
HOOK = "https://hooks.example/services/T0/B0/plainhook"
SECRET = "webhook-secret-plain"
SLACK = ChannelSettings(kind="slack", name="#sales", endpoint=HOOK, webhook_secret=SECRET)
TELEGRAM = ChannelSettings(
    kind="telegram", name="Sales", endpoint="https://api.telegram.example", bot_token=TOKEN, chat_id="-100"
)


@pytest.fixture
def use_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The deployment's keys, as a list the test may change (first encrypts)."""
    keys = [Fernet.generate_key().decode()]
    monkeypatch.setattr(sealed, "deployment_keys", lambda: keys_from(",".join(keys)))
    yield keys


@pytest_asyncio.fixture
async def no_channel(db_engine: AsyncEngine) -> AsyncIterator[None]:
    yield
    async with db_engine.begin() as conn:
        await conn.execute(delete(ChatChannel).where(ChatChannel.tenant_id.in_(["acme", "globex"])))


async def raw_rows(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT * FROM chat_channels"))).all()
    return repr([tuple(row) for row in rows])


async def test_no_secret_is_stored_in_plain_text(
    db_engine: AsyncEngine, use_keys: list[str], no_channel: None
) -> None:
    async with session_factory(db_engine).begin() as session:
        await set_channel(session, "acme", TELEGRAM, "carol")
        await set_channel(session, "globex", SLACK, "carol")
        await set_channel(session, "globex", SLACK, "carol")  # replacing goes through the same sealing
    stored = await raw_rows(db_engine)
    assert "globex" in stored and "gAAAAA" in stored  # the rows, with Fernet tokens in them
    for secret in (TOKEN, HOOK, SECRET, "plain"):
        assert secret not in stored
    async with session_factory(db_engine)() as session:
        channel = await session.get(ChatChannel, "acme")
        assert channel is not None and (channel.bot_token, channel.endpoint) == (TOKEN, TELEGRAM.endpoint)
        shown = await channel_view(session, "globex")
    assert shown is not None and shown.inbound and SECRET not in shown.model_dump_json()


async def test_another_key_opens_nothing_and_names_no_secret(
    db_engine: AsyncEngine, use_keys: list[str], no_channel: None
) -> None:
    async with session_factory(db_engine).begin() as session:
        await set_channel(session, "acme", TELEGRAM, "carol")
    use_keys[:] = [Fernet.generate_key().decode()]
    async with session_factory(db_engine)() as session:
        with pytest.raises(SealBroken) as broken:
            await session.get(ChatChannel, "acme")
    assert "chat_channels" in str(broken.value) and TOKEN not in str(broken.value)


async def test_a_key_rotates_new_first_rekey_then_old_dropped(
    db_engine: AsyncEngine, use_keys: list[str], no_channel: None
) -> None:
    async with session_factory(db_engine).begin() as session:
        await set_channel(session, "acme", TELEGRAM, "carol")
    before = await raw_rows(db_engine)
    use_keys.insert(0, Fernet.generate_key().decode())  # the new key first, the old one still opens
    async with session_factory(db_engine).begin() as session:
        assert await rekey(session) == 1
    assert await raw_rows(db_engine) != before
    del use_keys[1:]  # the old key dropped: every value opens with the new one alone
    async with session_factory(db_engine)() as session:
        channel = await session.get(ChatChannel, "acme")
    assert channel is not None and channel.bot_token == TOKEN


def test_a_key_that_is_not_a_fernet_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValueError, match="Fernet keys") as refused:
        keys_from("not-a-key-secretvalue")
    assert "secretvalue" not in str(refused.value)
