"""The network lab: build, connectivity, link cut, shaping changes, cleanup (also after a crash)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tools.lab import (
    DELAY_DIR,
    Lab,
    LabError,
    SiteSpec,
    cleanup_prefix,
    delay_supported,
    list_namespaces,
)

pytestmark = pytest.mark.root
PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _need_root() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.skip("needs root, iproute2 and nftables")


def _prefix(tag: str) -> str:
    return f"cfl{tag}{os.getpid() % 100000}"


def _can_connect(lab: Lab, src: str, dst: str, port: int) -> bool:
    code = textwrap.dedent(f"""
        import socket, sys
        try:
            socket.create_connection(("{lab.addr(dst)}", {port}), timeout=3.0).close()
        except OSError:
            sys.exit(1)
    """)
    return lab.run(src, [PY, "-c", code], timeout=10).returncode == 0


def _listener(lab: Lab, site: str, port: int) -> subprocess.Popen[str]:
    p = lab.popen(site, [PY, "-m", "tools.lab", "serve", "--port", str(port), "--seconds", "15"],
                  stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and "listening" in p.stdout.readline()
    return p


def test_up_route_cut_and_down() -> None:
    prefix = _prefix("u")
    lab = Lab([SiteSpec("a"), SiteSpec("b", rate_mbit=50)], prefix=prefix)
    with lab:
        assert set(list_namespaces(prefix)) == {f"{prefix}-a", f"{prefix}-b", f"{prefix}-rt"}
        assert lab.addr("a") != lab.addr("b")
        srv = _listener(lab, "b", 6000)
        try:
            assert _can_connect(lab, "a", "b", 6000)
            lab.link_down("b")
            assert not _can_connect(lab, "a", "b", 6000)
            lab.link_up("b")
            assert _can_connect(lab, "a", "b", 6000)
        finally:
            srv.kill()
            srv.wait(timeout=5)
        lab.set_rate("b", None)
        lab.set_rate("a", 10)
        lab.set_loss("b", 0.02)
        rules = subprocess.run(["ip", "netns", "exec", lab.router, "nft", "list", "ruleset"],
                               capture_output=True, text=True, check=True).stdout
        assert rules.count("numgen random mod 1000000 < 20000") == 2  # both directions
        lab.set_loss("b", 0.0)
        qd = subprocess.run(["tc", "-n", lab.ns("a"), "qdisc", "show", "dev", "eth0"],
                            capture_output=True, text=True, check=True).stdout
        assert "tbf" in qd
    assert list_namespaces(prefix) == []


def test_cleanup_after_crash() -> None:
    prefix = _prefix("c")
    crash = textwrap.dedent(f"""
        import os
        from tools.lab import Lab, SiteSpec
        Lab([SiteSpec("a"), SiteSpec("b")], prefix="{prefix}").up()
        os._exit(3)  # no down(): the namespaces outlive the process
    """)
    cp = subprocess.run([PY, "-c", crash], cwd=REPO, timeout=60, check=False)
    assert cp.returncode == 3
    assert len(list_namespaces(prefix)) == 3
    # A new lab with the same prefix removes the stale ones before building.
    with Lab([SiteSpec("x")], prefix=prefix):
        assert set(list_namespaces(prefix)) == {f"{prefix}-x", f"{prefix}-rt"}
    assert list_namespaces(prefix) == []
    # And the CLI's cleanup removes them too.
    subprocess.run([PY, "-c", crash], cwd=REPO, timeout=60, check=False)
    cli = subprocess.run([PY, "-m", "tools.lab", "cleanup", "--prefix", prefix], cwd=REPO,
                         timeout=60, check=False, capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert list_namespaces(prefix) == []
    assert cleanup_prefix(prefix) == []


def test_cleanup_leaves_other_prefixes_alone() -> None:
    mine, other = _prefix("m"), _prefix("mx")
    with Lab([SiteSpec("a")], prefix=other):
        with Lab([SiteSpec("a")], prefix=mine):
            pass
        assert len(list_namespaces(other)) == 2


@pytest.mark.parametrize(
    "sites",
    [[SiteSpec("a"), SiteSpec("a")], [SiteSpec("rt")], [SiteSpec("A")],
     [SiteSpec("a", loss=1.5)], [SiteSpec("a", rate_mbit=0)], []],
)
def test_bad_specs_rejected(sites: list[SiteSpec]) -> None:
    with pytest.raises(LabError):
        Lab(sites, prefix=_prefix("b"))


def _connect_ms(lab: Lab, src: str, dst: str) -> float:
    """Median time of 5 connects to a closed port (SYN -> RST: one round trip)."""
    code = textwrap.dedent(f"""
        import socket, statistics, time
        ts = []
        for _ in range(5):
            s = socket.socket()
            s.settimeout(2.0)
            t = time.perf_counter()
            try:
                s.connect(("{lab.addr(dst)}", 9))
            except OSError:
                pass
            ts.append((time.perf_counter() - t) * 1000)
            s.close()
        print(statistics.median(ts))
    """)
    cp = lab.run(src, [PY, "-c", code], timeout=30, capture_output=True, text=True)
    return float(cp.stdout.strip())


def test_delay_line() -> None:
    if not delay_supported():
        pytest.skip("no /dev/net/tun")
    prefix = _prefix("d")
    with Lab([SiteSpec("a", delay_ms=1.0), SiteSpec("b"), SiteSpec("c")], prefix=prefix) as lab:
        lab.set_delay("b", 3.0)
        # RTT grows by 2 * (delay_src + delay_dst); delay can only add, so
        # lower bounds are safe whatever the machine's load.
        assert _connect_ms(lab, "a", "b") >= 2 * (1.0 + 3.0) * 0.95
        assert _connect_ms(lab, "a", "c") >= 2 * 1.0 * 0.95
        lab.set_delay("a", 0.0)
        lab.set_delay("b", 0.0)
        # Back on the kernel's path: no site is routed into the delay line any more.
        rules = subprocess.run(["ip", "-n", lab.router, "rule", "show"], capture_output=True,
                               text=True, check=True).stdout
        assert lab.addr("a") not in rules and lab.addr("b") not in rules, rules
        assert lab.spec("b").delay_ms == 0.0
    assert list_namespaces(prefix) == []
    assert not (DELAY_DIR / f"{prefix}.json").exists()
