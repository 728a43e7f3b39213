"""Time zones: which names are IANA zones, a person's zone, and a span as read in a zone."""

from __future__ import annotations

import functools
import zoneinfo
from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator

from tools.resolve import Person


@functools.cache
def known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _iana_zone(name: str) -> str:
    if name not in known_zones():
        raise ValueError("must be an IANA time zone name, e.g. Europe/Berlin or America/New_York")
    return name


IanaZone = Annotated[str, AfterValidator(_iana_zone)]


def zone_of(person: Person, hint: str | None) -> str:
    """A user's zone, as read with them from the database; a contact's from the caller's hint, else UTC."""
    if person.user_id is not None:
        return person.tz or "UTC"
    return hint or "UTC"


def local_span(start: datetime, end: datetime, zone: str) -> str:
    local_start, local_end = (
        start.astimezone(zoneinfo.ZoneInfo(zone)),
        end.astimezone(zoneinfo.ZoneInfo(zone)),
    )
    return f"{local_start:%a %Y-%m-%d %H:%M}-{local_end:%H:%M} {zone}"
