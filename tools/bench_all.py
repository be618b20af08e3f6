"""``make bench``: every ``tools/bench_*.py`` in turn, then one combined table.

Each benchmark runs as its own process (one at a time: they all want the
CPUs), in a short mode so the whole run stays under ~15 minutes on a small
machine: known benchmarks get the arguments in ``QUICK`` below, an unknown
``bench_*`` gets ``--quick`` if its ``--help`` offers it. Every benchmark
prints markdown tables with its baseline measured in the same run; this
collects every table row into one table (benchmark | row | the row's figures,
each labelled with its column), prints it, prints the benchmarks' own tables
below it, and with ``--doc FILE`` writes both between the ``bench_all``
markers of that file (``docs/scale.md`` by default when ``--doc`` is given
without a value). With ``--readme [FILE]`` each benchmark's tables also replace
what stands between its ``<!-- bench:NAME:begin -->`` / ``<!-- bench:NAME:end -->``
markers in the README (a benchmark that failed leaves its block alone), with a
line saying which run produced them; ``make bench`` does both.

    python -m tools.bench_all [--full] [--only ingest,reaction] [--doc [FILE]] [--readme [FILE]]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "scale.md"
README = REPO / "README.md"
BEGIN, END = "<!-- bench_all:begin -->", "<!-- bench_all:end -->"
ORDER = ("placement", "k8s", "agent", "offline", "ingest", "reaction", "reaction_k8s")
# Short modes; each benchmark's own defaults are its full run (--full).
QUICK: dict[str, list[str]] = {
    "placement": ["--quick"],
    "k8s": ["--quick"],  # 100 nodes / 500 pods, 3 reps; --nodes/--pods for the larger sizes
    "agent": ["--phase-seconds", "6"],
    "offline": ["--kills", "5", "--cuts", "3", "--partitions", "2", "--no-doc"],
    "ingest": ["--quick"],
    "reaction": ["--quick"],
    "reaction_k8s": ["--runs", "5"],
}
FULL_EXTRA: dict[str, list[str]] = {"offline": ["--no-doc"]}
NEEDS_ROOT = {"agent", "offline", "reaction", "reaction_k8s"}
TIMEOUT_S = {"placement": 600, "k8s": 900, "agent": 300, "offline": 600, "ingest": 600,
             "reaction": 900, "reaction_k8s": 600}


@dataclass
class Outcome:
    name: str
    argv: list[str]
    rc: int
    seconds: float
    stdout: str
    stderr: str

    @property
    def tables(self) -> list[list[str]]:
        """The markdown tables in stdout (header, rule and rows), in order."""
        out: list[list[str]] = []
        cur: list[str] = []
        for line in self.stdout.splitlines():
            if line.strip().startswith("|"):
                cur.append(line.strip())
            elif cur:
                out.append(cur)
                cur = []
        if cur:
            out.append(cur)
        return [t for t in out if len(t) >= 3]


def discover() -> list[str]:
    found = sorted(p.stem[len("bench_"):] for p in (REPO / "tools").glob("bench_*.py")
                   if p.stem != "bench_all")
    return [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]


def args_for(name: str, full: bool) -> list[str]:
    if full:
        return list(FULL_EXTRA.get(name, []))
    if name in QUICK:
        return list(QUICK[name])
    cp = subprocess.run([sys.executable, "-m", f"tools.bench_{name}", "--help"], cwd=REPO,
                        capture_output=True, text=True, timeout=60, check=False)
    return ["--quick"] if "--quick" in cp.stdout else []


def run_one(name: str, full: bool) -> Outcome:
    argv = [sys.executable, "-m", f"tools.bench_{name}", *args_for(name, full)]
    if name in NEEDS_ROOT and os.geteuid() != 0:
        return Outcome(name, argv, -1, 0.0, "", "skipped: needs root (network namespaces)")
    print(f"# bench_{name}: {' '.join(argv[2:])}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        cp = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                            timeout=TIMEOUT_S.get(name, 900) * (3 if full else 1), check=False)
        rc, out, err = cp.returncode, cp.stdout, cp.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -9
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        err = "timed out"
    took = time.monotonic() - t0
    print(f"# bench_{name}: rc={rc} in {took:.0f} s", file=sys.stderr, flush=True)
    return Outcome(name, argv, rc, took, out, err)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def combined(outcomes: Sequence[Outcome]) -> str:
    """Every row of every benchmark table as one table; figures labelled by their column."""
    lines = ["| benchmark | row | figures (column: value) |", "|---|---|---|"]
    for o in outcomes:
        if o.rc != 0 and not o.tables:
            why = o.stderr.strip().splitlines()[-1:] or [f"rc={o.rc}"]
            lines.append(f"| {o.name} | not run / failed | {why[0][:160]} |")
            continue
        for t in o.tables:
            head = _cells(t[0])
            for row in t[2:]:
                cells = _cells(row)
                label = cells[0] if cells else ""
                figs = "; ".join(f"{h}: {v}" if h else v
                                 for h, v in zip(head[1:], cells[1:], strict=False) if v)
                context = head[0] if head and head[0] and head[0] != label else ""
                name = f"{context} — {label}" if context else label
                lines.append(f"| {o.name} | {name} | {figs} |")
    return "\n".join(lines)


def write_doc(text: str, path: Path) -> None:
    block = f"{BEGIN}\n{text}\n{END}"
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.write_text(new)


def readme_markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


def update_readme(outcomes: Sequence[Outcome], path: Path, when: str, full: bool) -> list[str]:
    """Replace each benchmark's README block with the tables it printed; returns the
    names whose block was rewritten."""
    text = path.read_text()
    done = []
    for o in outcomes:
        begin, end = readme_markers(o.name)
        if o.rc != 0 or not o.tables or begin not in text or end not in text:
            continue
        tables = "\n\n".join("\n".join(t) for t in o.tables)
        note = (f"<!-- written by `make bench` ({'full' if full else 'quick'} mode, "
                f"`{' '.join(o.argv[2:])}`), {when}: edit the benchmark, not this block -->")
        block = f"{begin}\n{note}\n\n{tables}\n\n{end}"
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
        done.append(o.name)
    path.write_text(text)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_all",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--full", action="store_true", help="each benchmark's full defaults")
    ap.add_argument("--only", default="", help="comma list, e.g. ingest,reaction")
    ap.add_argument("--doc", nargs="?", const=str(DOC), default=None,
                    help="write the tables between the bench_all markers of this file")
    ap.add_argument("--readme", nargs="?", const=str(README), default=None,
                    help="replace each benchmark's marked block in this README")
    a = ap.parse_args(argv)
    names = discover()
    if a.only:
        want = {x.strip() for x in a.only.split(",") if x.strip()}
        names = [n for n in names if n in want]
    t0 = time.monotonic()
    outcomes = [run_one(n, a.full) for n in names]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (f"`make bench` ({'full' if a.full else 'quick'} mode), {when}, "
            f"{os.cpu_count()} CPUs (shared), {time.monotonic() - t0:.0f} s in all. Each "
            "figure sits beside its baseline, measured in the same run.")
    parts = [head, "", combined(outcomes)]
    for o in outcomes:
        parts += ["", f"### bench_{o.name} (`{' '.join(o.argv[2:])}`, {o.seconds:.0f} s, "
                  f"rc {o.rc})", ""]
        body = [ln for ln in o.stdout.strip().splitlines() if ln.strip()]
        parts += body or [f"(no output; {o.stderr.strip().splitlines()[-1:] or ''})"]
    text = "\n".join(parts)
    print(text)
    if a.doc:
        write_doc(text, Path(a.doc))
    if a.readme:
        done = update_readme(outcomes, Path(a.readme), when, a.full)
        print(f"# README blocks rewritten: {', '.join(done) or 'none'}", file=sys.stderr)
    return 0 if all(o.rc in (0, -1) for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
