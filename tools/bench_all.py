"""``make bench``: every ``tools/bench_*.py`` in turn, then one combined table.

Each benchmark runs as its own process (one at a time: they all want the
CPUs), in a short mode so the whole run stays under ~15 minutes on a small
machine: known benchmarks get the arguments in ``QUICK`` below, an unknown
``bench_*`` gets ``--quick`` if its ``--help`` offers it. Every benchmark
prints markdown tables with its baseline measured in the same run; this
collects every table row into one table (benchmark | row | the row's figures,
each labelled with its column) and prints it.

``--results [FILE]`` (``docs/benchmarks/results.md`` by default) writes each
benchmark's output into its own section of that generated file, between
``<!-- results:NAME:begin -->`` / ``<!-- results:NAME:end -->`` markers, under a
line with the date, the machine and the command; a benchmark that failed or did
not run leaves its section as it was. ``--readme [FILE]`` rewrites the headline
table between ``<!-- bench:headline:begin -->`` / ``<!-- bench:headline:end -->``
in the README: one row per entry of ``HEADLINE``, each taken from the tables of
the benchmark it names (its cfnet row beside the baseline row or columns of the
same run) and dated; a row this run did not measure keeps its previous text,
or says "not measured yet". ``make bench`` does both.

    python -m tools.bench_all [--full] [--only ingest,reaction] [--results [FILE]] [--readme [FILE]]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "docs" / "benchmarks" / "results.md"
README = REPO / "README.md"
HEADLINE_BEGIN, HEADLINE_END = "<!-- bench:headline:begin -->", "<!-- bench:headline:end -->"
NOT_MEASURED = "not measured yet"
ORDER = ("placement", "k8s", "agent", "offline", "ingest", "reaction", "reaction_k8s")
# Short modes; each benchmark's own defaults are its full run (--full).
QUICK: dict[str, list[str]] = {
    "placement": ["--quick"],
    # 100 nodes / 500 pods, 3 reps; --nodes/--pods for the larger sizes; then pods arriving
    # at 20/s for 10 s on each running scheduler (the headline's arrival row)
    "k8s": ["--quick", "--arrival", "20", "--arrival-seconds", "10"],
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


@dataclass(frozen=True)
class Headline:
    """One row of the README's headline table and where its figures come from.

    The figures are the ``columns`` of the first row matching ``row`` in the first
    table of benchmark ``bench`` that has those columns (and, when ``table`` is set,
    a header mentioning it). The baseline is the same columns of the row matching
    ``base_row`` in that table, or else the ``base_columns`` of the cfnet row itself.
    Rows and columns match exactly, else by prefix, else by substring (case ignored).
    """

    label: str
    bench: str
    row: str
    columns: tuple[str, ...]
    base_row: str = ""
    base_columns: tuple[str, ...] = ()
    table: str = ""


HEADLINE: tuple[Headline, ...] = (
    Headline("Kubernetes burst: pods bound per second, first binding (bench_k8s)", "k8s",
             "cfnet", ("pods/s", "first binding s"), base_row="kube-scheduler, QPS 5000"),
    # Pods created one at a time: a bench_k8s table whose header says "arrival", with
    # p50 and p99 columns and a cfnet and a kube-scheduler row, fills this row.
    Headline("Kubernetes arrival latency, pods created one at a time (bench_k8s)", "k8s",
             "cfnet", ("p50", "p99"), base_row="kube-scheduler", table="arrival"),
    Headline("Placement engine alone: batch throughput, cost above the LP bound "
             "(bench_placement)", "placement", "cfnet engine", ("pods/s (wall)", "gap vs bound"),
             base_row="kube-style"),
    Headline("Agent, eBPF CO-RE: steady RSS, CPU of one core, first report (bench_agent)",
             "agent", "ebpf-core", ("steady RSS MiB", "CPU % of 1 core", "first report s"),
             base_row="sockdiag"),
    Headline("Offline detection: an agent killed (bench_offline)", "offline",
             "agent SIGKILL", ("p50", "max"), base_columns=("Kubernetes default",)),
    Headline("Ingest: queued reports drained by the core (bench_ingest)", "ingest",
             "MQTT in a child process", ("cfnet", "ratio"),
             base_columns=("baseline",)),
    Headline("Reaction: link degraded to re-placement decision (bench_reaction)", "reaction",
             "degradation -> re-placement", ("p50 s", "p99 s"), base_row="sensing floor"),
)


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

    @property
    def ok(self) -> bool:
        return self.rc == 0 and bool(self.tables)

    @property
    def command(self) -> str:
        return "python " + " ".join(self.argv[1:])


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


def machine() -> str:
    """The machine in a few words: CPUs, their model, memory, load when this runs."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = " ".join(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPUs {platform.machine()}{f' ({model})' if model else ''}"
            f"{mem}, load average {load:.1f} at the end")


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


def _find(names: Sequence[str], want: str) -> int | None:
    """Index of the name matching ``want``: exactly, else by prefix, else by substring."""
    low = [n.casefold() for n in names]
    w = want.casefold()
    for test in (lambda n: n == w, lambda n: n.startswith(w), lambda n: w in n):
        for i, n in enumerate(low):
            if test(n):
                return i
    return None


def _figures(head: Sequence[str], cells: Sequence[str], columns: Sequence[str]) -> str | None:
    out = []
    for c in columns:
        i = _find(head, c)
        if i is None or i >= len(cells):
            return None
        out.append(f"{head[i]}: {cells[i]}")
    return "; ".join(out)


def headline_cells(spec: Headline, outcome: Outcome) -> tuple[str, str] | None:
    """(cfnet figures, baseline figures) for one headline row, or None when the
    benchmark's tables do not hold them."""
    for t in outcome.tables:
        head = _cells(t[0])
        if spec.table and spec.table.casefold() not in t[0].casefold():
            continue
        rows = [_cells(r) for r in t[2:]]
        labels = [r[0] if r else "" for r in rows]
        i = _find(labels, spec.row)
        if i is None:
            continue
        ours = _figures(head, rows[i], spec.columns)
        if ours is None:
            continue
        if spec.base_row:
            j = _find(labels, spec.base_row)
            base = None if j is None else _figures(head, rows[j], spec.columns)
            base = f"{labels[j]}: {base}" if base is not None and j is not None else None
        else:
            base = _figures(head, rows[i], spec.base_columns)
        return ours, base if base is not None else "–"
    return None


def _old_rows(block: str) -> dict[str, str]:
    rows = {}
    for line in block.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows[_cells(line)[0]] = line
    return rows


def headline_block(outcomes: Sequence[Outcome], old: str, when: str, where: str,
                   command: str) -> str:
    """The README's headline table: fresh rows from this run, the others as they were."""
    previous = _old_rows(old)
    by_name = {o.name: o for o in outcomes if o.ok}
    lines = [f"<!-- written by `{command}` ({when}; {where}): edit tools/bench_all.py "
             "(HEADLINE), not this block -->", "",
             "| figure | cfnet | baseline, same run | measured |", "|---|---|---|---|"]
    for spec in HEADLINE:
        o = by_name.get(spec.bench)
        got = headline_cells(spec, o) if o is not None else None
        if got is not None and o is not None:
            lines.append(f"| {spec.label} | {got[0]} | {got[1]} | {when}, `{o.command}` |")
        elif spec.label in previous:
            lines.append(previous[spec.label])
        else:
            lines.append(f"| {spec.label} | {NOT_MEASURED} | – | – |")
    return "\n".join(lines)


def _between(text: str, begin: str, end: str) -> tuple[int, int] | None:
    if begin in text and end in text[text.index(begin):]:
        start = text.index(begin)
        return start, text.index(end, start) + len(end)
    return None


def update_readme(outcomes: Sequence[Outcome], path: Path, when: str, where: str,
                  command: str) -> list[str]:
    """Rewrite the README's headline block; returns the labels of the rows this run
    measured. A README without the markers is left alone."""
    text = path.read_text()
    span = _between(text, HEADLINE_BEGIN, HEADLINE_END)
    if span is None:
        return []
    block = headline_block(outcomes, text[span[0]:span[1]], when, where, command)
    path.write_text(f"{text[:span[0]]}{HEADLINE_BEGIN}\n{block}\n\n{HEADLINE_END}"
                    f"{text[span[1]:]}")
    return [h.label for h in HEADLINE
            if any(o.name == h.bench and o.ok and headline_cells(h, o) for o in outcomes)]


def results_markers(name: str) -> tuple[str, str]:
    return f"<!-- results:{name}:begin -->", f"<!-- results:{name}:end -->"


def _as_markdown(stdout: str) -> str:
    """A benchmark's stdout as markdown: each table, and each run of other lines, a
    paragraph of its own (a line next to a table would break it); a run of several other
    lines (a plain-text table, say) as a code block, so that its columns stay aligned."""
    groups: list[list[str]] = []
    for line in (ln.rstrip() for ln in stdout.strip().splitlines()):
        if not line.strip():
            continue
        is_row = line.lstrip().startswith("|")
        if groups and groups[-1][0].lstrip().startswith("|") == is_row:
            groups[-1].append(line.strip() if is_row else line)
        else:
            groups.append([line.strip() if is_row else line])
    return "\n\n".join("\n".join(g) if len(g) == 1 or g[0].lstrip().startswith("|")
                         else "```text\n" + "\n".join(g) + "\n```" for g in groups)


RESULTS_HEAD = """# Benchmark results

<!-- generated by `make bench` (tools/bench_all.py); edit the benchmarks, not this file -->

The latest figures of each benchmark in `tools/`, written by `make bench`
(`python -m tools.bench_all --results docs/benchmarks/results.md --readme README.md`).
Each section says when, on what machine and with which command its figures were
measured; a benchmark that fails or does not run leaves its section as it was. Every
table holds the baseline measured in the same run, and the median and spread where
the benchmark repeats a measurement. What each benchmark measures and how: its
module docstring (`python -m tools.bench_NAME --help`) and the page of its area
([docs/README.md](../README.md)).
"""


def update_results(outcomes: Sequence[Outcome], path: Path, when: str, where: str,
                   full: bool) -> list[str]:
    """Replace (or add) the section of each benchmark that ran and printed something;
    returns the names written."""
    text = path.read_text() if path.exists() else RESULTS_HEAD
    done = []
    for o in outcomes:
        if o.rc != 0 or not o.stdout.strip():
            continue
        begin, end = results_markers(o.name)
        body = (f"{begin}\nMeasured {when} on {where}, {o.seconds:.0f} s "
                f"({'full' if full else 'quick'} mode, tools/bench_all):\n"
                f"`{o.command}`\n\n{_as_markdown(o.stdout)}\n{end}")
        span = _between(text, begin, end)
        if span is None:
            text = f"{text.rstrip()}\n\n## bench_{o.name}\n\n{body}\n"
        else:
            text = text[:span[0]] + body + text[span[1]:]
        done.append(o.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_all",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--full", action="store_true", help="each benchmark's full defaults")
    ap.add_argument("--only", default="", help="comma list, e.g. ingest,reaction")
    ap.add_argument("--results", nargs="?", const=str(RESULTS), default=None,
                    help="write each benchmark's section of this generated results file")
    ap.add_argument("--readme", nargs="?", const=str(README), default=None,
                    help="rewrite the headline table between the bench:headline markers")
    a = ap.parse_args(argv)
    names = discover()
    if a.only:
        want = {x.strip() for x in a.only.split(",") if x.strip()}
        names = [n for n in names if n in want]
    t0 = time.monotonic()
    outcomes = [run_one(n, a.full) for n in names]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    where = machine()
    command = "python -m tools.bench_all " + " ".join(argv if argv is not None else sys.argv[1:])
    head = (f"`{command.strip()}` ({'full' if a.full else 'quick'} mode), {when}, {where}, "
            f"{time.monotonic() - t0:.0f} s in all. Each figure sits beside its baseline, "
            "measured in the same run.")
    parts = [head, "", combined(outcomes)]
    for o in outcomes:
        parts += ["", f"### bench_{o.name} (`{o.command}`, {o.seconds:.0f} s, rc {o.rc})", ""]
        parts.append(_as_markdown(o.stdout) or f"(no output; {o.stderr.strip()[-200:]})")
    print("\n".join(parts))
    if a.results:
        done = update_results(outcomes, Path(a.results), when, where, a.full)
        print(f"# results sections written: {', '.join(done) or 'none'}", file=sys.stderr)
    if a.readme:
        rows = update_readme(outcomes, Path(a.readme), when, where, command.strip())
        print(f"# README headline rows measured: {len(rows)}", file=sys.stderr)
    return 0 if all(o.rc in (0, -1) for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
