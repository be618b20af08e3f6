"""The CO-RE agent's import set is pinned: nothing heavy that its path does not use.

The agent's resident memory: every module a long-lived agent imports stays
mapped for its life. These imports happen only where they are used, and these tests keep
them there (a subprocess, so this process's imports do not count):

- the agent's whole run path (what ``edge_agent.main._run`` imports, the CO-RE probe and
  its loader, a configuration from flags, the host sampler) imports no BCC, no pyroute2
  (sock_diag's), no prometheus_client (the metrics port's), no PyYAML (a config file's),
  no pynvml without an NVIDIA driver, no ``cryptography`` (the core's; the agent enrols
  with the openssl command), and
  not ``urllib.request``/``email``/``http.client`` (paho-mqtt's proxy lookup, see
  :mod:`edge_agent.lightimport`), nor ``shutil`` with ``bz2`` and ``lzma`` (argparse's
  help width, which the agent's parser is given), nor ``typing_extensions`` (msgspec's,
  when installed: this virtualenv has it for mypy and pydantic), nor ``inspect`` with
  ``ast`` and ``dis`` (dataclasses', for a dataclass without a docstring: the agent's
  all have one);
- argparse (with gettext) parses the command line and is then dropped and freed
  (``edge_agent.main.read_config``), before the heavy imports;
- each of those still loads where it is used: a YAML config file brings PyYAML, the
  metrics module brings prometheus_client, ``import urllib.request`` after paho is the
  real module, a dataclass without a docstring gets its signature as one (and
  ``import inspect`` after is the real module).

The running agent (real process, real broker, CO-RE loaded) is checked the same way,
with its RSS, in tests/integration/test_agent_footprint.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edge_agent.host import nvidia_driver

REPO = Path(__file__).resolve().parents[2]

# Heavy modules the CO-RE agent's path must not import (each: who needs it instead).
FORBIDDEN = {
    "bcc": "the BCC fallback loader, in its own process",
    "pyroute2": "the sock_diag fallback probe",
    "prometheus_client": "the metrics port",
    "yaml": "a YAML config file",
    "cryptography": "nothing: the core's only (the agent enrols with the openssl command)",
    "urllib.request": "paho-mqtt's proxy lookup (PySocks only)",
    "email": "urllib.request",
    "http.client": "urllib.request",
    "shutil": "argparse's help width (edge_agent.config's formatter is given it)",
    "bz2": "shutil",
    "lzma": "shutil",
    "typing_extensions": "msgspec's support for its types, when installed (see "
                         "edge_agent.lightimport; the agent's types use typing)",
    "inspect": "dataclasses, for a dataclass without a docstring (give it one; see "
               "edge_agent.lightimport)",
    "ast": "inspect",
    "dis": "inspect",
}
RUN_PATH = """
import json, sys
from edge_agent.main import mqtt_settings
from edge_agent.config import load_config
cfg = load_config(sys.argv[1:])
from edge_agent.active import ActiveProber, EchoServer
from edge_agent.agent import Agent, offline_status
from edge_agent.buffer import ReportBuffer
from edge_agent.host import HostSampler, local_addresses
from edge_agent.wire.mqtt import MqttClient, Will
from edge_agent.probes import ProbeConfig, open_probe
from edge_agent.probes.ebpf import EbpfProbe
from edge_agent import bpf_loader, libbpf_loader
from edge_agent.wire import status_topic
mqtt_settings(cfg)
HostSampler().close()
local_addresses()
print(json.dumps(sorted(sys.modules)))
"""


def _modules(code: str, *args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def _present(mods: set[str], name: str) -> bool:
    return name in mods or any(m.startswith(name + ".") for m in mods)


def test_the_core_agent_path_imports_nothing_heavy() -> None:
    mods = _modules(RUN_PATH, "--node", "imp-1", "--ebpf")
    found = {m: why for m, why in FORBIDDEN.items() if _present(mods, m)}
    assert not found, f"imported on the CO-RE agent's path (and who needs them): {found}"
    if not nvidia_driver():
        assert not _present(mods, "pynvml"), "pynvml imported without an NVIDIA driver"
    # It is the path meant: the CO-RE loader, paho, the buffer's SQLite.
    assert {"edge_agent.libbpf_loader", "paho.mqtt.client", "sqlite3"} <= mods


def test_a_yaml_config_file_still_brings_pyyaml(tmp_path: Path) -> None:
    conf = tmp_path / "agent.yaml"
    conf.write_text("node: imp-2\ninterval_s: 2\n")
    code = ("import json, sys\nfrom edge_agent.config import load_config\n"
            "cfg = load_config(sys.argv[1:])\nassert cfg.node == 'imp-2', cfg\n"
            "assert cfg.interval_s == 2, cfg\nprint(json.dumps(sorted(sys.modules)))")
    assert "yaml" in _modules(code, "--config", str(conf))


def test_the_metrics_module_brings_prometheus_client() -> None:
    code = "import json, sys, edge_agent.metrics\nprint(json.dumps(sorted(sys.modules)))"
    assert "prometheus_client" in _modules(code)


def test_urllib_request_after_paho_is_the_real_module() -> None:
    code = ("import json, sys, edge_agent.wire.mqtt\n"
            "assert 'urllib.request' not in sys.modules\n"
            "import urllib.request\n"
            "assert callable(urllib.request.getproxies), urllib.request\n"
            "from urllib.request import urlopen\n"
            "import paho.mqtt.client as c\n"
            "assert c.urllib.request is urllib.request\n"
            "print(json.dumps(sorted(sys.modules)))")
    assert "http.client" in _modules(code)


def test_with_pysocks_present_paho_is_imported_as_is(tmp_path: Path) -> None:
    # A stand-in ``socks`` module (named as such; PySocks is not a dependency): its mere
    # presence makes paho's proxy lookup live, so urllib.request must be the real one.
    (tmp_path / "socks.py").write_text('"""fake PySocks for the import test"""\n'
                                       'HTTP, SOCKS4, SOCKS5 = 3, 1, 2\n')
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
            "import json, edge_agent.wire.mqtt, paho.mqtt.client as c\n"
            "assert c.socks is not None\n"
            "assert callable(c.urllib.request.proxy_bypass)\n"
            "print(json.dumps(sorted(sys.modules)))")
    assert "urllib.request" in _modules(code)


def test_help_is_still_wrapped_to_the_terminal_width() -> None:
    # The parser is given the width ($COLUMNS) instead of letting argparse find it with
    # shutil; --help must still wrap to it (an option longer than the width stays whole).
    def help_lines(columns: int) -> list[str]:
        r = subprocess.run([sys.executable, "-m", "edge_agent.main", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=60, check=False,
                           env={"COLUMNS": str(columns), "PATH": "/usr/bin:/bin"})
        assert r.returncode == 0, r.stderr[-2000:]
        assert "--broker-host" in r.stdout, r.stdout[:2000]
        return r.stdout.splitlines()

    narrow, wide = help_lines(60), help_lines(200)
    assert len(narrow) > len(wide), (len(narrow), len(wide))
    assert max(len(line) for line in wide) > 100, max(wide, key=len)
    assert sum(len(line) > 60 for line in narrow) <= 2, [x for x in narrow if len(x) > 60]


def test_typing_extensions_after_the_config_is_the_real_module() -> None:
    # msgspec was imported without it (edge_agent.lightimport); a later import gets the
    # real module, and msgspec still converts the agent's configuration.
    code = ("import json, sys\nfrom edge_agent.config import load_config\n"
            "assert 'typing_extensions' not in sys.modules\n"
            "import typing_extensions\n"
            "assert callable(typing_extensions.get_type_hints), typing_extensions\n"
            "cfg = load_config(['--node', 'imp-3', '--interval-s', '2'])\n"
            "assert cfg.interval_s == 2.0, cfg\n"
            "print(json.dumps(sorted(sys.modules)))")
    assert "typing_extensions" in _modules(code)


def test_with_typing_extensions_imported_first_msgspec_is_imported_as_is() -> None:
    code = ("import json, sys, typing_extensions\nimport edge_agent.config\n"
            "import msgspec._utils as u\n"
            "assert u._get_type_hints is typing_extensions.get_type_hints\n"
            "print(json.dumps(sorted(sys.modules)))")
    assert "msgspec" in _modules(code)


def test_argparse_is_freed_once_the_configuration_is_read() -> None:
    # Nothing else holds argparse or gettext: dropped from sys.modules, they are freed (a
    # module left alive by some reference would be imported a second time by the next user).
    code = ("import json, sys, weakref\n"
            "from edge_agent.config import PARSE_ONLY_MODULES, load_config\n"
            "import edge_agent.config as config\n"
            "seen = {}\n"
            "real = config.load_config\n"
            "def spy(argv):\n"
            "    cfg = real(argv)\n"
            "    seen.update({n: weakref.ref(sys.modules[n]) for n in PARSE_ONLY_MODULES})\n"
            "    return cfg\n"
            "import edge_agent.main as main\n"
            "main.load_config = spy\n"
            "cfg = main.read_config(['--node', 'imp-4', '--ebpf'])\n"
            "assert cfg.node == 'imp-4', cfg\n"
            "assert sorted(seen) == ['argparse', 'gettext'], seen\n"
            "alive = [n for n, r in seen.items() if r() is not None]\n"
            "assert not alive, f'still referenced after forget: {alive}'\n"
            "from edge_agent.probes import ebpf\n"  # the agent's next imports: none brings it
            "import edge_agent.agent, edge_agent.buffer, edge_agent.host, edge_agent.active\n"
            "assert 'argparse' not in sys.modules\n"
            "import argparse\n"  # a later user gets it again
            "assert callable(argparse.ArgumentParser)\n"
            "print(json.dumps(sorted(sys.modules)))")
    assert "argparse" in _modules(code)


def test_a_module_something_else_holds_is_not_forgotten() -> None:
    # In a process that uses argparse itself, dropping it would leave it alive and make
    # the next import a second copy: forget keeps it, and gettext after it.
    code = ("import json, sys, argparse\n"
            "import edge_agent.main as main\n"
            "cfg = main.read_config(['--node', 'imp-5'])\n"
            "assert sys.modules['argparse'] is argparse\n"
            "assert 'gettext' in sys.modules\n"
            "print(json.dumps(sorted(sys.modules)))")
    assert "argparse" in _modules(code)


def test_a_dataclass_without_a_docstring_still_gets_its_signature() -> None:
    # dataclasses' ``inspect`` is a stand-in until used (edge_agent.lightimport): the
    # signature docstring still comes, through the real module, which is then the one
    # ``import inspect`` gives.
    code = ("import json, sys, edge_agent.wire, dataclasses\n"
            "assert 'inspect' not in sys.modules, 'inspect imported by the package'\n"
            "@dataclasses.dataclass\nclass P:\n    a: int\n    b: str = 'x'\n"
            "assert P.__doc__ == \"P(a: int, b: str = 'x')\", P.__doc__\n"
            "import inspect\n"
            "assert callable(inspect.signature) and type(inspect).__name__ == 'module'\n"
            "assert str(inspect.signature(P)) == \"(a: int, b: str = 'x') -> None\"\n"
            "print(json.dumps(sorted(sys.modules)))")
    assert "ast" in _modules(code)


def test_one_malloc_arena_unless_the_environment_says_otherwise() -> None:
    # cfnet-agent asks glibc for one malloc arena before its threads start; an
    # explicit MALLOC_ARENA_MAX (or GLIBC_TUNABLES arena setting) is left to glibc.
    code = "from edge_agent.main import one_malloc_arena\nprint(one_malloc_arena())"

    def run(env: dict[str, str]) -> str:
        r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                           text=True, timeout=60, check=False,
                           env={"PATH": "/usr/bin:/bin", **env})
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip()

    assert run({}) == "True"
    assert run({"MALLOC_ARENA_MAX": "4"}) == "False"
    assert run({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == "False"
