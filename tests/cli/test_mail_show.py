"""`mail show N` prints what the sender wrote, not its transfer encoding (issue 41, item 9)."""

from __future__ import annotations

from email.message import EmailMessage
from pathlib import Path

from countersign.devstack.mail import caught

TEXT = "Hi Jane — thanks for the call. " * 4 + "Next step: a proposal by Friday (50 % deposit)."


def test_a_quoted_printable_message_reads_as_written(tmp_path: Path) -> None:
    sent = EmailMessage()
    sent["From"] = "countersign@example.com"
    sent["To"] = "jane.doe@example.com"
    sent["Subject"] = "Our call — next steps"
    sent.set_content(TEXT, cte="quoted-printable")
    (tmp_path / "1700000000000-1.eml").write_bytes(sent.as_bytes())
    kept = tmp_path.joinpath("1700000000000-1.eml").read_text()
    assert "=E2=80=94" in kept and "=\n" in kept  # as the catcher keeps it
    shown = caught(tmp_path)[0].readable()
    assert shown.endswith("\n\n" + TEXT)
    assert "Subject: Our call — next steps" in shown
    assert "Content-Transfer-Encoding" not in shown  # the body shown is no longer encoded
