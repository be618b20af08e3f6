"""The repository's text is reference: a short README, an index of every docs page, and
no word about how the project was made (who worked on it, in which step)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 150
# Phrases that speak of the work rather than of the software. Words with a technical
# meaning here stay allowed: "leader"/"leading" (election), an algorithm's or a prober's
# "round", the "next round" of a loop.
PROCESS = re.compile("|".join((
    r"\bthe lead\b", r"\bengineers?\b", r"\bclosing notes?\b", r"\bissues? #?\d+",
    r"\bweakness(?:es)? \d+", r"\bfindings? \d+", r"\bthis round\b", r"\bby round\b",
    r"\b(?:earlier|previous|third|fourth|fifth|sixth) (?:rounds?|pass)\b",
    r"\bround's (?:method|narrative)", r"\bowner asked\b",
)), re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".txt", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini",
                 ".sh", ".c", ".h", ".tpl", ".conf", ".service", ".go", ".j2", ""}


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True, timeout=60).stdout.decode().split("\0")
    files = []
    for name in filter(None, out):
        path = ROOT / name
        if path.suffix in TEXT_SUFFIXES and path.is_file() and path != Path(__file__):
            files.append(path)
    return files


def test_no_text_speaks_of_how_the_project_was_made() -> None:
    files = tracked_text_files()
    assert len(files) > 100  # the checkout's own files, not an empty listing
    hits = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            m = PROCESS.search(line)
            if m:
                hits.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def test_the_process_pattern_tells_the_work_from_the_software() -> None:
    for said in ("re-measured by the lead", "six engineers share it", "see the closing notes",
                 "issue 27's fourth round", "Issue 26, weakness 9", "after finding 6",
                 "footprint by round", "this round: -1.3 MiB"):
        assert PROCESS.search(said), said
    for meant in ("the leader holds the Lease", "the leading core approves", "flow rounds",
                  "a prober will retry next round", "round-robin", "around 5 s",
                  "the last round the API server answered", "Kubernetes rounds it up"):
        assert not PROCESS.search(meant), meant


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_docs_index_links_every_page() -> None:
    index = ROOT / "docs" / "README.md"
    text = index.read_text()
    linked = {(index.parent / m).resolve() for m in re.findall(r"\]\(([^)#\s]+\.md)", text)}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p != index}
    assert pages, "no docs pages"
    assert not pages - linked, f"not in docs/README.md: {sorted(map(str, pages - linked))}"
    assert not {p for p in linked if not p.exists()}, "docs/README.md links a missing page"


def test_the_readme_links_the_rest_and_carries_the_headline_table() -> None:
    text = (ROOT / "README.md").read_text()
    for target in ("docs/README.md", "docs/benchmarks/results.md", "CHANGELOG.md",
                   "CONTRIBUTING.md", "LICENSE", "docs/install.md"):
        assert f"]({target})" in text, target
    block = text[text.index("<!-- bench:headline:begin -->"):
                 text.index("<!-- bench:headline:end -->")]
    assert "arrival latency" in block and "| Kubernetes burst" in block


def test_relative_links_resolve() -> None:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
             *(ROOT / "docs").rglob("*.md")]
    broken = []
    for page in pages:
        prose = re.sub(r"`[^`\n]*`", "", page.read_text())  # code spans hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            path = target.split("#", 1)[0]
            if path and "://" not in target and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
