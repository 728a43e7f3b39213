"""One way to reach Temporal: the pydantic data converter, so payloads stay typed end to end."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from countersign.config import Settings


async def connect(settings: Settings) -> Client:
    try:
        return await Client.connect(
            settings.temporal_address, namespace=settings.namespace, data_converter=pydantic_data_converter
        )
    except RuntimeError as exc:
        raise RuntimeError(
            f"cannot reach Temporal at {settings.temporal_address}: start the embedded stack "
            "(`countersign dev up`) or set TEMPORAL_ADDRESS"
        ) from exc
