"""The data converter every Countersign client and worker uses: pydantic, plus no silent drops.

The Python SDK drops a signal whose payload does not decode (a log line, nothing else), fails the
workflow *task* (retried forever) when a start input does not decode, and rejects such an update.
Handlers that declare `Model | Unreadable` (countersign.core.bounds) get an `Unreadable` instead, with
the reason: a signal is then refused on the record, and a start input fails its workflow once. Such
a payload with a key twice in one object is unreadable too.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverter, PayloadConverter
from temporalio.exceptions import ApplicationError, FailureError

from countersign.core.bounds import DuplicateKey, Unreadable, cut, encodable, loads_strict, storable

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


def refuse_duplicate_keys(payload: Payload) -> None:
    """Raise `DuplicateKey` when a JSON payload names a key twice in an object (pydantic would keep
    the last: an edit's `to` could differ from what its sender's own parser read)."""
    if payload.metadata.get("encoding") != b"json/plain":
        return
    try:
        loads_strict(payload.data)
    except DuplicateKey:
        raise
    except (ValueError, RecursionError):
        return  # not JSON, or nested past the parser: pydantic's decoding says why


class LenientPydanticPayloadConverter(PydanticPayloadConverter):
    """Decodes `Model | Unreadable` hints as `Model`, or as `Unreadable` when that fails; encodes
    every value, a lone surrogate in any string included.

    Everything workflow code hands to Temporal passes here (activity and local activity inputs and
    results, summaries, details, query and update results, signals, markers): a lone surrogate from
    outside (`"\\ud800"` in the model's arguments, an MCP server's text) made the encoding raise,
    and with it every workflow task, forever. Such a value is encoded with U+FFFD in place of each
    lone surrogate; a value that encodes is never touched (the fallback only runs after a failure).
    """

    def to_payloads(self, values: Sequence[Any]) -> list[Payload]:
        try:
            return super().to_payloads(values)
        except Exception as exc:
            try:
                return super().to_payloads([encodable(v) for v in values])
            except Exception:
                raise exc from None

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
                refuse_duplicate_keys(payload)
                values += super().from_payloads([payload], [real])
            except Exception as exc:  # whatever the decoder raises, the handler refuses on the record
                excerpt = payload.data[:EXCERPT_CHARS].decode("utf-8", "replace")
                values.append(Unreadable(unreadable=why(exc), excerpt=storable(excerpt)))
        return values


class EncodableFailureConverter(DefaultFailureConverter):
    """Encodes an error whose message holds a lone surrogate (a protobuf string cannot) with
    U+FFFD in its place: an error quoting outside text must fail its call, not the workflow task."""

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        try:
            super().to_failure(exception, payload_converter, failure)
        except UnicodeEncodeError:
            failure.Clear()
            message = exception.message if isinstance(exception, FailureError) else str(exception)
            error = ApplicationError(
                encodable(message),
                type=exception.type if isinstance(exception, ApplicationError) else type(exception).__name__,
                non_retryable=isinstance(exception, ApplicationError) and exception.non_retryable,
            )
            error.__cause__ = exception.__cause__
            super().to_failure(error, payload_converter, failure)


data_converter: DataConverter = dataclasses.replace(
    pydantic_data_converter,
    payload_converter_class=LenientPydanticPayloadConverter,
    failure_converter_class=EncodableFailureConverter,
)
