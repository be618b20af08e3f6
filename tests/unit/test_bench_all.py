"""`make bench` rewrites the README's headline table and the results file's sections,
and only what the run measured."""

from __future__ import annotations

from pathlib import Path

from tools.bench_all import (
    HEADLINE,
    HEADLINE_BEGIN,
    HEADLINE_END,
    NOT_MEASURED,
    Outcome,
    update_readme,
    update_results,
)

K8S_OUT = """noise before
| scheduler (100 nodes / 500 pods) | pods/s | pods/s after 1st | first binding s | bound |
|---|---:|---:|---:|---:|
| kube-scheduler | 51 (50–52) | 52 | 0.37 | 500/500 |
| kube-scheduler, QPS 5000 | 202 (173–265) | 207 | 0.37 | 500/500 |
| cfnet | 553 (508–572) | 635 | 0.72 (0.70–1.00) | 500/500 |
| cfnet, baseline tree | 9 | 9 | 9.99 | 500/500 |
trailer
"""
ARRIVAL_OUT = """| arrival: one pod at a time (100 nodes) | p50 ms | p99 ms |
|---|---:|---:|
| kube-scheduler | 12.0 | 40.1 |
| cfnet | 3.5 | 9.8 |
"""
WHEN, WHERE = "2026-12-03 09:00 UTC", "2 CPUs x86_64, load average 0.5 at the end"
BURST, ARRIVAL, AGENT = HEADLINE[0].label, HEADLINE[1].label, HEADLINE[3].label


def _readme(tmp_path: Path, rows: str) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{HEADLINE_BEGIN}\n| figure | cfnet | baseline | measured |\n"
                      f"|---|---|---|---|\n{rows}{HEADLINE_END}\nend\n")
    return readme


def _row(text: str, label: str) -> str:
    return next(ln for ln in text.splitlines() if ln.startswith(f"| {label} |"))


def test_headline_rows_come_from_the_run_others_keep_their_text(tmp_path: Path) -> None:
    readme = _readme(tmp_path, f"| {AGENT} | 26.6 MiB | 38.6 MiB | 2026-12-02 |\n"
                               f"| {BURST} | 1 | 2 | 2026-11-01 |\n")
    k8s = Outcome("k8s", ["py", "-m", "tools.bench_k8s", "--quick"], 0, 1.0, K8S_OUT, "")
    failed = Outcome("agent", ["py", "-m", "tools.bench_agent"], 1, 1.0,
                     "| mode | steady RSS MiB |\n|---|---|\n| ebpf-core | 99 |\n", "boom")
    done = update_readme([k8s, failed], readme, WHEN, WHERE, "python -m tools.bench_all")
    assert done == [BURST]
    text = readme.read_text()
    burst = _row(text, BURST)
    assert "pods/s: 553 (508–572); first binding s: 0.72 (0.70–1.00)" in burst
    assert "kube-scheduler, QPS 5000: pods/s: 202 (173–265); first binding s: 0.37" in burst
    assert f"{WHEN}, `python -m tools.bench_k8s --quick`" in burst and "2026-11-01" not in text
    assert _row(text, AGENT) == f"| {AGENT} | 26.6 MiB | 38.6 MiB | 2026-12-02 |"  # failed run
    assert NOT_MEASURED in _row(text, ARRIVAL)  # no arrival table in this run
    assert f"`python -m tools.bench_all` ({WHEN}; {WHERE})" in text
    assert len([ln for ln in text.splitlines() if ln.startswith("| ")]) == len(HEADLINE) + 1
    assert text.startswith("intro\n") and text.endswith(f"{HEADLINE_END}\nend\n")


def test_the_arrival_row_is_filled_once_bench_k8s_prints_its_table(tmp_path: Path) -> None:
    readme = _readme(tmp_path, f"| {ARRIVAL} | {NOT_MEASURED} | – | – |\n")
    k8s = Outcome("k8s", ["py", "-m", "tools.bench_k8s"], 0, 1.0, K8S_OUT + ARRIVAL_OUT, "")
    assert update_readme([k8s], readme, WHEN, WHERE, "cmd") == [BURST, ARRIVAL]
    row = _row(readme.read_text(), ARRIVAL)
    assert "| p50 ms: 3.5; p99 ms: 9.8 | kube-scheduler: p50 ms: 12.0; p99 ms: 40.1 |" in row
    assert NOT_MEASURED not in row


def test_a_readme_without_the_markers_is_left_alone(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    k8s = Outcome("k8s", ["py", "-m", "tools.bench_k8s"], 0, 1.0, K8S_OUT, "")
    assert update_readme([k8s], readme, WHEN, WHERE, "cmd") == []
    assert readme.read_text() == "no markers\n"


def test_results_sections_are_replaced_added_or_kept(tmp_path: Path) -> None:
    results = tmp_path / "benchmarks" / "results.md"
    k8s = Outcome("k8s", ["py", "-m", "tools.bench_k8s", "--quick"], 0, 12.0, K8S_OUT, "")
    assert update_results([k8s], results, WHEN, WHERE, False) == ["k8s"]
    first = results.read_text()
    assert first.startswith("# Benchmark results\n") and "## bench_k8s" in first
    assert f"Measured {WHEN} on {WHERE}, 12 s (quick mode" in first
    assert "`python -m tools.bench_k8s --quick`" in first
    # the table stands apart from the lines around it, so that it renders
    assert "noise before\n\n| scheduler (100 nodes" in first and "500/500 |\n\ntrailer" in first
    agent = Outcome("agent", ["py", "-m", "tools.bench_agent"], 0, 5.0,
                    "| mode | steady RSS MiB |\n|---|---|\n| ebpf-core | 26.6 |\n", "")
    failed = Outcome("k8s", ["py", "-m", "tools.bench_k8s"], 1, 1.0, "", "boom")
    assert update_results([failed, agent], results, "2026-12-04 10:00 UTC", WHERE,
                          True) == ["agent"]
    second = results.read_text()
    assert second.startswith(first.rstrip())  # the k8s section is untouched
    assert "## bench_agent" in second and "| ebpf-core | 26.6 |" in second
    again = Outcome("agent", ["py", "-m", "tools.bench_agent"], 0, 5.0,
                    "| mode | steady RSS MiB |\n|---|---|\n| ebpf-core | 25.0 |\n", "")
    update_results([again], results, "2026-12-05 10:00 UTC", WHERE, True)
    third = results.read_text()
    assert "| ebpf-core | 25.0 |" in third and "26.6" not in third
    assert third.count("## bench_agent") == 1 and third.count("results:agent:begin") == 1


def test_plain_text_output_is_kept_aligned_in_a_code_block(tmp_path: Path) -> None:
    results = tmp_path / "results.md"
    out = ("5000 nodes, 20 pods\nper pod (CPU ms)  median  p10\ndiagnose   100.5   77.2\n"
           "explain     67.1   53.5\n")
    conflict = Outcome("conflict", ["py", "-m", "tools.bench_conflict"], 0, 15.0, out, "")
    assert update_results([conflict], results, WHEN, WHERE, False) == ["conflict"]
    text = results.read_text()
    assert "```text\n5000 nodes, 20 pods\nper pod (CPU ms)  median  p10\n" in text
    assert "explain     67.1   53.5\n```\n<!-- results:conflict:end -->" in text
