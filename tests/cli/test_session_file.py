"""Where the CLI keeps its `login` session: never where the user may not write (issue 41, item 8:
compose's `docker compose exec worker countersign login …` wrote under site-packages as a non-root
user). The image's user is simulated: root writes anywhere, so `os.access` answers as that user
would, refusing the installed package's directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from countersign.cli import session


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A non-editable install: the data directory is under a site-packages only root may write."""
    site = tmp_path / "site-packages"
    site.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setattr(session, "DATA_DIR", site / ".data")
    monkeypatch.setattr("countersign.cli.session.os.access", lambda p, mode: not Path(p).is_relative_to(site))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("COUNTERSIGN_SESSION_FILE", raising=False)
    return home


def test_an_installed_package_keeps_the_session_in_the_users_home(installed: Path) -> None:
    assert session.session_file() == installed / ".countersign" / "inbox-session.json"


def test_a_checkout_keeps_it_in_its_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "DATA_DIR", tmp_path / "checkout" / ".data")
    monkeypatch.delenv("COUNTERSIGN_SESSION_FILE", raising=False)
    assert session.session_file() == tmp_path / "checkout" / ".data" / "inbox-session.json"


@pytest.mark.usefixtures("installed")
def test_countersign_session_file_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COUNTERSIGN_SESSION_FILE", str(tmp_path / "volume" / "session.json"))
    assert session.session_file() == tmp_path / "volume" / "session.json"
