"""One way to reach Temporal: the pydantic data converter (countersign.payloads), so payloads stay
typed end to end."""

from __future__ import annotations

from temporalio.client import Client

from countersign.config import Settings
from countersign.payloads import data_converter


async def connect(settings: Settings) -> Client:
    try:
        return await Client.connect(
            settings.temporal_address, namespace=settings.namespace, data_converter=data_converter
        )
    except RuntimeError as exc:
        raise RuntimeError(
            f"cannot reach Temporal at {settings.temporal_address}: run `python starter.py dev up` "
            "or set TEMPORAL_ADDRESS"
        ) from exc
