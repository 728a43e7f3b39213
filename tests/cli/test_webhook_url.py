"""`inbox webhook`: a URL a webhook can post to, not the README's placeholder (issue 41, item 9)."""

from __future__ import annotations

import pytest

from countersign.cli.inbox import webhook_refusal


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.slack.com/…",  # the README's, as typed
        "https://hooks.slack.com/services/...",
        "hooks.slack.com/services/T0/B0/x",
        "https:///services/T0",
        "https://hooks.slack.com/services/T0 B0",
        "ftp://hooks.slack.com/services/T0/B0/x",
    ],
)
def test_a_url_nothing_can_post_to_is_refused(url: str) -> None:
    assert webhook_refusal(url)


@pytest.mark.parametrize(
    "url", ["https://hooks.slack.com/services/T0000/B0000/XXXXXXXX", "http://127.0.0.1:9000/hook"]
)
def test_a_webhook_url_is_accepted(url: str) -> None:
    assert webhook_refusal(url) is None
