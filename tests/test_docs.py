"""What the README and the Makefile say of each other, and where the README's links lead (the site's
own links are checked by `make docs`: mkdocs build --strict)."""

from __future__ import annotations

import re

from countersign.runtime.config import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
MAKEFILE = PROJECT_ROOT / "Makefile"


def test_every_relative_link_of_the_readme_leads_to_a_file() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert local, "the README links no page of the documentation"
    missing = [t for t in local if not (PROJECT_ROOT / t).is_file()]
    assert not missing, f"README.md links files that are not there: {missing}"


def test_the_readme_says_as_many_test_workers_as_the_makefile_runs() -> None:
    (said,) = re.findall(r"test files run on (\d+) workers", README.read_text())
    (runs,) = re.findall(r"^TEST_WORKERS \?= (\d+)$", MAKEFILE.read_text(), re.M)
    assert said == runs, f"README.md says {said} test workers, the Makefile runs {runs}"


def test_every_phony_target_of_the_makefile_has_a_rule() -> None:
    text = MAKEFILE.read_text()
    (phony,) = re.findall(r"^\.PHONY: (.+)$", text, re.M)
    without = [t for t in phony.split() if not re.search(rf"^{re.escape(t)}:", text, re.M)]
    assert not without, f"declared .PHONY with no rule: {without}"
