"""Agent configuration sources and terminal formatting."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_core.view import fmt_age, fmt_bps, fmt_bytes, fmt_us, table
from edge_agent.config import load_config
from edge_agent.errors import ConfigError


def test_cli_overrides_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("node: edge-file\ninterval_s: 2\npeers: [10.0.0.1]\nlabels: {site: a}\n")
    monkeypatch.setenv("CFNET_INTERVAL_S", "3")
    cfg = load_config(["-c", str(f), "--no-ebpf"])
    assert (cfg.node, cfg.interval_s, cfg.ebpf, cfg.peers) == ("edge-file", 3.0, False, ("10.0.0.1",))
    assert cfg.labels == (("site", "a"),) and cfg.username == "edge-file"
    cfg = load_config(["-c", str(f), "--interval-s", "0.5", "--node", "edge-cli"])
    assert (cfg.node, cfg.interval_s) == ("edge-cli", 0.5)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--node", "Bad/Node"], "invalid"),
    (["--node", "a", "--interval-s", "0"], "interval_s"),
    (["--node", "a", "--broker-port", "x"], "broker_port"),
])
def test_bad_config_is_a_clear_error(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(argv)


def test_unknown_config_keys_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("node: a\nintervall_s: 2\n")
    with pytest.raises(ConfigError, match="intervall_s"):
        load_config(["-c", str(f)])


@pytest.mark.parametrize(("fn", "value", "text"), [
    (fmt_us, 850, "850µs"), (fmt_us, 12_345, "12.3ms"), (fmt_us, None, "-"),
    (fmt_bps, 20e6, "20.0Mb/s"), (fmt_bps, 0, "-"), (fmt_bytes, 3 << 30, "3.0GiB"),
    (fmt_age, 5, "5s"), (fmt_age, 600, "10m"), (fmt_age, float("inf"), "never"),
])
def test_formatters(fn: object, value: object, text: str) -> None:
    assert fn(value) == text  # type: ignore[operator]


def test_table_aligns_columns() -> None:
    out = table([("a", 1), ("bbb", 22)], ("X", "Y"))
    assert out.splitlines() == ["X    Y", "a    1", "bbb  22"]


@pytest.mark.parametrize("word", ["enabled", "yes", "on", "off", "no", ""])
def test_a_boolean_that_is_not_one_is_refused_naming_the_key(
        word: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """CFNET_TLS=enabled was read as false: TLS off. Now it is an error naming the key."""
    monkeypatch.setenv("CFNET_TLS", word)
    with pytest.raises(ConfigError, match=r"CFNET_TLS.*true, false, 1 or 0"):
        load_config(["--node", "a"])


@pytest.mark.parametrize(("word", "want"), [("true", True), ("FALSE", False), ("1", True),
                                            ("0", False)])
def test_booleans_from_the_environment(word: str, want: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CFNET_TLS", word)
    monkeypatch.setenv("CFNET_EBPF", word)
    cfg = load_config(["--node", "a"])
    assert (cfg.tls, cfg.ebpf) == (want, want)


@pytest.mark.parametrize(("text", "needle"), [
    ("node: a\ntls: 'yes'\n", r"\$\.tls"),  # a string is not a boolean in the file
    ("node: a\nbroker_port: '8883'\n", r"\$\.broker_port"),
    ("node: a\nlabels: [a, b]\n", r"\$\.labels"),
    ("node: a\nbroker-port: 1883\n", "broker-port"),
])
def test_the_file_is_read_strictly(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(["-c", str(f)])
