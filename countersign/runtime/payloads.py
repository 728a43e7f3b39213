"""The data converter every Countersign client and worker uses: pydantic, plus no silent drops.

The Python SDK drops a signal whose payload does not decode (a log line, nothing else), fails the
workflow *task* (retried forever) when a start input does not decode, and rejects such an update.
Handlers that declare `Model | Unreadable` (countersign.core.bounds) get an `Unreadable` instead, with
the reason: a signal is then refused on the record, and a start input fails its workflow once.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter

from countersign.core.bounds import Unreadable, cut, storable

EXCERPT_CHARS = 500


def _without_unreadable(hint: Any) -> Any | None:
    """The handler's real type when `hint` is `Model | Unreadable`, else None."""
    if get_origin(hint) not in (Union, types.UnionType):
        return None
    members = get_args(hint)
    if Unreadable not in members:
        return None
    rest = tuple(m for m in members if m is not Unreadable)
    return rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 (a runtime union of a tuple)


def why(exc: BaseException) -> str:
    """The innermost error's message: the validation error, not the SDK's wrapper around it."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, ValidationError):
        text = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'payload'}: {e['msg']}" for e in exc.errors())
    else:
        text = str(exc)
    return cut(storable(text), 2_000)


class LenientPydanticPayloadConverter(PydanticPayloadConverter):
    """Decodes `Model | Unreadable` hints as `Model`, or as `Unreadable` when that fails."""

    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        if not type_hints or len(type_hints) != len(payloads):
            return super().from_payloads(payloads, type_hints)
        values: list[Any] = []
        for payload, hint in zip(payloads, type_hints, strict=True):
            real = _without_unreadable(hint)
            if real is None:
                values += super().from_payloads([payload], [hint])
                continue
            try:
                values += super().from_payloads([payload], [real])
            except Exception as exc:  # whatever the decoder raises, the handler refuses on the record
                excerpt = payload.data[:EXCERPT_CHARS].decode("utf-8", "replace")
                values.append(Unreadable(unreadable=why(exc), excerpt=storable(excerpt)))
        return values


data_converter: DataConverter = dataclasses.replace(
    pydantic_data_converter, payload_converter_class=LenientPydanticPayloadConverter
)
