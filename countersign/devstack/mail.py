"""The embedded stack's mail catcher: an SMTP server on 127.0.0.1 (`dev up` runs it on port 8025,
COUNTERSIGN_MAIL_PORT) that delivers nothing and keeps every message it receives as a file in
`.data/mail/`, so that a person can read what the demo sent (`starter.py mail list`, `mail show N`):
reviewers' notices and the agents' emails alike."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

NOTICE_HEADER = "X-Countersign-Notice"


class Catcher:
    """aiosmtpd's handler: every message accepted becomes `<millis>-<n>.eml` in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._numbers = itertools.count(1)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        content = (envelope.original_content or b"").replace(b"\r\n", b"\n")
        name = f"{time.time_ns() // 1_000_000}-{next(self._numbers)}.eml"
        (self.directory / name).write_bytes(content)
        return "250 Message accepted (kept by the mail catcher, not delivered)"


def catching(directory: Path, host: str, port: int) -> Controller:
    """A started catcher (stop it with `.stop()`)."""
    controller = Controller(Catcher(directory), hostname=host, port=port)
    controller.start()
    return controller


@dataclass(frozen=True)
class Caught:
    number: int  # 1 = the oldest kept
    path: Path
    message: EmailMessage

    @property
    def kind(self) -> str:
        """A reviewers' notice's kind (request, reminder, escalation), or `email` (an agent's)."""
        return str(self.message.get(NOTICE_HEADER) or "email")

    def readable(self) -> str:
        """Its headers, then its text as the sender wrote it: quoted-printable and base64 are how the
        message travelled, not what a person reads (`mail show` printed `=E2=80=94` and `=\n`)."""
        m = self.message
        headers = [f"{name}: {value}" for name, value in m.items() if name != "Content-Transfer-Encoding"]
        body = m.get_body(preferencelist=("plain", "html"))
        text = body.get_content() if body is not None else ""
        return "\n".join(headers) + "\n\n" + str(text).rstrip("\n")

    def summary(self) -> dict[str, str | int]:
        m = self.message
        return {
            "number": self.number, "kind": self.kind, "date": str(m.get("Date", "")),
            "from": str(m.get("From", "")), "to": str(m.get("To", "")), "subject": str(m.get("Subject", "")),
        }  # fmt: skip


def caught(directory: Path) -> list[Caught]:
    """What the catcher kept, oldest first."""
    if not directory.is_dir():
        return []
    paths = sorted(directory.glob("*.eml"), key=lambda p: tuple(int(x) for x in p.stem.split("-")))
    return [
        Caught(number=i, path=path, message=message_from_bytes(path.read_bytes(), policy=policy.default))
        for i, path in enumerate(paths, start=1)
    ]
