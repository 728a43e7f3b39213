"""bench/sections.py: each bench module replaces its own section of docs/benchmark.md, nothing else."""

from pathlib import Path

import pytest

from bench.sections import put_section

DOC = """<!-- bench.run -->
# Benchmark
old report
<!-- /bench.run -->

<!-- bench.mcp -->
## MCP
old mcp
<!-- /bench.mcp -->
"""


def test_replaces_only_its_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmark.md"
    doc.write_text(DOC)
    put_section(doc, "bench.run", "# Benchmark\nnew report\n")
    assert doc.read_text() == DOC.replace("old report", "new report")


def test_appends_a_missing_section_at_the_end(tmp_path: Path) -> None:
    doc = tmp_path / "benchmark.md"
    doc.write_text(DOC)
    put_section(doc, "bench.inbox", "\n## Inbox\nnumbers\n")
    assert doc.read_text() == DOC + "\n<!-- bench.inbox -->\n## Inbox\nnumbers\n<!-- /bench.inbox -->\n"


def test_first_puts_a_missing_section_at_the_start(tmp_path: Path) -> None:
    doc = tmp_path / "benchmark.md"
    doc.write_text("<!-- bench.mcp -->\nmcp\n<!-- /bench.mcp -->\n")
    put_section(doc, "bench.run", "report", first=True)
    assert doc.read_text() == (
        "<!-- bench.run -->\nreport\n<!-- /bench.run -->\n\n<!-- bench.mcp -->\nmcp\n<!-- /bench.mcp -->\n"
    )


def test_creates_the_file(tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "benchmark.md"
    put_section(doc, "bench.run", "report\n")
    assert doc.read_text() == "<!-- bench.run -->\nreport\n<!-- /bench.run -->\n"


def test_idempotent(tmp_path: Path) -> None:
    doc = tmp_path / "benchmark.md"
    doc.write_text(DOC)
    put_section(doc, "bench.inbox", "## Inbox\n")
    put_section(doc, "bench.mcp", "## MCP\nnew mcp")
    once = doc.read_text()
    put_section(doc, "bench.inbox", "## Inbox\n")
    put_section(doc, "bench.mcp", "## MCP\nnew mcp")
    assert doc.read_text() == once
    assert once.count("<!-- bench.inbox -->") == 1
    assert once.count("<!-- bench.mcp -->") == 1


def test_a_name_is_not_a_prefix_of_another(tmp_path: Path) -> None:
    doc = tmp_path / "benchmark.md"
    doc.write_text("<!-- bench.runner -->\nother\n<!-- /bench.runner -->\n")
    put_section(doc, "bench.run", "report")
    assert "other" in doc.read_text()
    assert doc.read_text().count("<!-- bench.run -->") == 1


def test_an_unclosed_section_is_refused(tmp_path: Path) -> None:
    doc = tmp_path / "benchmark.md"
    doc.write_text("<!-- bench.run -->\nreport\n")
    with pytest.raises(ValueError):
        put_section(doc, "bench.run", "new")
    assert doc.read_text() == "<!-- bench.run -->\nreport\n"


def test_the_benchmark_doc_has_every_section_once() -> None:
    text = Path(__file__).parents[2].joinpath("docs", "benchmark.md").read_text()
    names = ["run", "observability", "mcp", "conversation_length", "inbox", "hostile"]
    for name in names:
        assert text.count(f"<!-- bench.{name} -->") == 1, name
        assert text.count(f"<!-- /bench.{name} -->") == 1, name
    assert text.startswith("<!-- bench.run -->\n# Benchmark\n")
