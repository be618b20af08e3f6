"""`make bench` rewrites the README's marked benchmark tables, and only those."""

from __future__ import annotations

from pathlib import Path

from tools.bench_all import Outcome, update_readme


def test_marked_blocks_get_the_benchmarks_tables_failed_ones_stay(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench:ingest:begin -->\n| old | x |\n|---|---|\n| a | 1 |\n"
                      "<!-- bench:ingest:end -->\nmiddle\n<!-- bench:agent:begin -->\n"
                      "| keep | y |\n<!-- bench:agent:end -->\nend\n")
    ok = Outcome("ingest", ["py", "-m", "tools.bench_ingest", "--quick"], 0, 1.0,
                 "noise\n| ingest | cfnet | ratio |\n|---|---:|---:|\n| drain | 9 | 86 % |\n"
                 "trailer\n", "")
    failed = Outcome("agent", ["py", "-m", "tools.bench_agent"], 1, 1.0,
                     "| probe | cpu |\n|---|---|\n| x | 1 |\n", "boom")
    assert update_readme([ok, failed], readme, "2026-11-30 12:00 UTC", False) == ["ingest"]
    text = readme.read_text()
    assert "| drain | 9 | 86 % |" in text and "| old | x |" not in text
    assert "`tools.bench_ingest --quick`), 2026-11-30 12:00 UTC" in text and "noise" not in text
    assert "| keep | y |" in text and "| x | 1 |" not in text  # failed run: block kept
    assert text.startswith("intro\n") and "\nmiddle\n" in text and text.endswith("end\n")
