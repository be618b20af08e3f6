"""BPF loaders: which one to use (CO-RE with libbpf, or BCC), and the BCC one itself.

:func:`choose` picks the loader: **CO-RE** (:mod:`edge_agent.libbpf_loader`, the prebuilt
object loaded by libbpf in the agent's process) wherever the kernel has BTF and libbpf is
installed, else **BCC**, which compiles the same C source on the device. The choice and
its reason travel in the :class:`Handoff`; the agent logs them and shows them in its
``/status`` and ``cfnet_agent_loader`` (:mod:`edge_agent.health`). BCC is a fallback only
where the operator asked for it (``bcc_fallback``). ``CFNET_BPF_LOADER``
(``auto``, the default; ``core``; ``bcc``) forces one, for the tests that run both and
for an operator working around a kernel.

The BCC loader runs in a **short-lived process of its own** (``python -m edge_agent.bpf_loader``,
started by :func:`start_loader`, which the agent calls first thing so the
compile runs beside its own start-up): that process imports BCC (and with it
libLLVM/clang, ~120 MiB mapped), compiles, loads and attaches the programs,
sends the program, map and perf-event (tracepoint attachment) file
descriptors to the agent over a Unix socket (SCM_RIGHTS) and exits. The
long-lived agent never imports BCC; it reads the maps with ``bpf(2)``
(:mod:`edge_agent.bpfsys`). The attachments live exactly as long as the
agent holds those descriptors: when it exits or is killed the kernel closes
them and detaches the programs.

Parameters reach the C code as ``-D`` flags only; the C source is never templated.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.errors import ProbeError

log = logging.getLogger(__name__)

ENV_BPF_DIR = "CFNET_BPF_DIR"
ENV_LOADER = "CFNET_BPF_LOADER"
LOADERS = ("auto", "core", "bcc")


def bpf_dir() -> Path:
    """Directory holding the BPF C sources: $CFNET_BPF_DIR, else the package's ``bpf/``.

    The sources live in the repository's top-level ``bpf/``; ``edge_agent/bpf``
    is a symlink to it, so they are package data: a wheel carries them as
    real files, and a checkout finds them through the link.
    """
    env = os.environ.get(ENV_BPF_DIR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent / "bpf"


def import_bcc() -> Any:
    try:
        import bcc  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:  # ImportError, or a broken libbcc raising OSError
        raise ProbeError(f"BCC not available: {exc}") from exc
    return bcc


def missing_tracepoints(names: Sequence[str]) -> list[str]:
    """Which of ``category:event`` tracepoints this kernel lacks (asks BCC, not uname)."""
    bcc = import_bcc()
    missing = []
    for name in names:
        category, _, event = name.partition(":")
        try:
            ok = bool(bcc.BPF.tracepoint_exists(category, event))
        except Exception:
            ok = False
        if not ok:
            missing.append(name)
    return missing


TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def ensure_tracefs() -> str:
    """Mount tracefs if no tracing directory is there; returns what it did, for the log.

    Inside ``ip netns exec`` (how agents run in the lab, and in some
    containers) /sys is a fresh sysfs for the new network namespace, without
    tracefs. Mounting it there stays private to that mount namespace. Must run
    before BCC is imported: BCC picks its tracing directory at import time.
    """
    for d in TRACEFS_DIRS:
        if Path(d, "events").is_dir():
            return ""
    if os.geteuid() != 0:
        return "tracefs not mounted and not root"
    try:
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS_DIRS[0]], check=True,
                       capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"tracefs not mounted and mounting it failed: {exc}"
    log.info("mounted tracefs at %s", TRACEFS_DIRS[0])
    return f"mounted tracefs at {TRACEFS_DIRS[0]}"


def tracepoint_fields(category: str, event: str) -> set[str]:
    """Field names of a tracepoint, from its tracefs ``format`` file (empty if unreadable)."""
    for d in TRACEFS_DIRS:
        fmt = Path(d, "events", category, event, "format")
        try:
            text = fmt.read_text()
        except OSError:
            continue
        names = set()
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("field:"):
                decl = line[len("field:"):].split(";", 1)[0]
                names.add(decl.split()[-1].split("[", 1)[0])
        return names
    return set()


def check_environment(tracepoints: Sequence[str]) -> None:
    """Raise ProbeError with a one-line reason if eBPF can't work here."""
    if os.geteuid() != 0:
        raise ProbeError("not root: eBPF needs CAP_BPF/CAP_PERFMON")
    ensure_tracefs()
    missing = missing_tracepoints(tracepoints)
    if missing:
        raise ProbeError(f"missing tracepoints: {', '.join(missing)} (is tracefs mounted?)")


def load(src_name: str, cflags: Sequence[str] = ()) -> Any:
    """Compile and load ``bpf/<src_name>`` with BCC; returns the ``bcc.BPF`` object."""
    bcc = import_bcc()
    directory = bpf_dir()
    src = directory / src_name
    if not src.is_file():
        raise ProbeError(f"BPF source {src} not found (set {ENV_BPF_DIR})")
    flags = [f"-I{directory}", *cflags]
    log.debug("loading %s with %s", src, " ".join(flags))
    try:
        return bcc.BPF(src_file=str(src).encode(), cflags=flags)
    except Exception as exc:
        raise ProbeError(f"loading {src_name} failed: {exc}") from exc


# --------------------------------------------------------------------------- loader process

# How long the agent waits for the loader: compiling with clang takes a few
# seconds, more on a small, busy device.
LOADER_TIMEOUT_S = 120.0
_MAX_FDS = 32


def kernel_offset_cflags() -> list[str]:
    """``-D`` flags with the few kernel struct offsets the programs read, from BTF.

    The loss ratio must be the kernel's (tcp_info: total_retrans / segs_out).
    Tracepoints alone can't give it: ``tcp:tcp_retransmit_skb`` fires once
    per skb while a GSO/TSO skb carries several segments, and no tracepoint
    counts segments sent. So ``tcp_probe`` reads ``tcp_sock.segs_out`` and
    ``tcp_sock.total_retrans`` of its socket, and the retransmit program reads
    ``tcp_skb_cb.tcp_gso_segs`` (in ``sk_buff.cb``). Every offset comes from
    the running kernel's BTF. Without BTF: no flags, and the programs fall
    back to one segment per retransmitted skb and an estimated segs_out.
    """
    from edge_agent.btf import Btf, BtfError
    from edge_agent.libbpf_loader import btf_path

    try:
        btf = Btf.vmlinux(btf_path())
        offs = {
            "CFNET_SKB_CB_OFF": btf.member_offset("sk_buff", "cb"),
            "CFNET_TCB_GSO_SEGS_OFF": btf.member_offset("tcp_skb_cb", "tcp_gso_segs"),
            "CFNET_TP_SEGS_OUT_OFF": btf.member_offset("tcp_sock", "segs_out"),
            "CFNET_TP_TOTAL_RETRANS_OFF": btf.member_offset("tcp_sock", "total_retrans"),
        }
    except BtfError as exc:
        log.warning("no kernel counters (loss estimated, retransmits per skb): %s", exc)
        return []
    return [f"-D{k}={v}" for k, v in offs.items()]


@dataclass
class LoadRequest:
    """What the agent asks the loader for (sent as JSON on its command line)."""

    source: str
    cflags: list[str] = field(default_factory=list)
    tracepoints: list[str] = field(default_factory=list)
    maps: list[str] = field(default_factory=list)
    # The same parameters for the CO-RE object (struct cf_config, map sizes): the -D flags
    # above are BCC's spelling of them.
    params: dict[str, int] = field(default_factory=dict)


@dataclass
class Handoff:
    """File descriptors the agent received; closing them detaches the programs."""

    maps: dict[str, int]
    progs: dict[str, int]
    links: list[int]
    cflags: list[str]
    loader_pid: int
    loader: str = "bcc"
    reason: str = ""  # why this loader (for BCC: why not CO-RE)
    kernel_counters: bool = False  # the programs read tcp_sock's segs_out/total_retrans
    owner: Any = None  # what owns the descriptors instead of us (libbpf's object, if kept)
    # Perf events the links hold (CO-RE on a kernel with BPF links: libbpf_loader._release)
    events: list[int] = field(default_factory=list)

    def close(self) -> None:
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.close()  # libbpf's: destroys the links (detach) and closes its descriptors
        else:
            for fd in [*self.links, *self.events, *self.progs.values(), *self.maps.values()]:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.links, self.events, self.progs, self.maps = [], [], {}, {}


class PendingLoad:
    """A loader process started and not yet answered (agent side; no BCC here).

    :func:`start_loader` returns at once, so the agent can start the loader
    first thing and do its own imports, buffer and broker connect while the
    loader compiles; :meth:`result` then takes the descriptors over. The
    request travels with it, so whoever claims it can check it is the load
    they need.
    """

    loader = "bcc"

    def __init__(self, req: LoadRequest) -> None:
        self.request = req
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock: socket.socket | None = ours
        try:
            argv = [sys.executable, "-m", "edge_agent.bpf_loader", "--fd", str(theirs.fileno()),
                    "--request", json.dumps(req.__dict__)]
            try:
                self._proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),),
                                              stdin=subprocess.DEVNULL)
            except OSError as exc:
                ours.close()
                self._sock = None
                raise ProbeError(f"cannot start the BPF loader: {exc}") from exc
        finally:
            theirs.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def result(self, timeout_s: float = LOADER_TIMEOUT_S) -> Handoff:
        """Wait for the loader's answer and take over its descriptors (once)."""
        ours = self._sock
        if ours is None:
            raise ProbeError("BPF loader already answered or cancelled")
        self._sock = None
        proc = self._proc
        ours.settimeout(timeout_s)
        fds: list[int] = []
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ours, 1 << 16, _MAX_FDS)
            for fd in fds:
                # recvmsg without MSG_CMSG_CLOEXEC: keep them out of any exec'd child,
                # or that child would hold the attachments after the agent died.
                os.set_inheritable(fd, False)
            reply: dict[str, Any] = (json.loads(msg.decode()) if msg
                                     else {"error": "loader exited silently"})
            if "error" in reply:
                raise ProbeError(str(reply["error"]))
            n = len(fds)

            def pick(i: int) -> int:
                if not 0 <= int(i) < n:
                    raise ProbeError(f"loader named descriptor {i} of {n}")
                return fds[int(i)]

            cflags = list(reply.get("cflags", []))
            hand = Handoff(maps={k: pick(v) for k, v in reply["maps"].items()},
                           progs={k: pick(v) for k, v in reply["progs"].items()},
                           links=[pick(v) for v in reply["links"]],
                           cflags=cflags, loader_pid=proc.pid, loader="bcc",
                           kernel_counters=any(f.startswith("-DCFNET_TP_SEGS_OUT_OFF")
                                               for f in cflags))
            ours.send(b"ok")  # the loader may exit now: the descriptors are ours
        except (OSError, ValueError, KeyError, TypeError) as exc:
            for fd in fds:
                os.close(fd)
            raise ProbeError(f"BPF loader hand-off failed: {exc}") from exc
        except ProbeError:
            for fd in fds:
                os.close(fd)
            raise
        finally:
            ours.close()  # EOF for a loader still waiting on an ack that won't come
            self._reap()
        return hand

    def cancel(self) -> None:
        """Not needed after all: close our end and reap the loader.

        Closing the socket is enough: a loader that already sent its
        descriptors waits for the ack, gets EOF and exits, and its exit
        detaches what it attached (the unreceived descriptors die with the
        socket). One still compiling is killed rather than waited for.
        """
        ours = self._sock
        self._sock = None
        if ours is None:
            return
        ours.close()
        if self._proc.poll() is None:
            self._proc.kill()
        self._reap()

    def _reap(self) -> None:
        proc = self._proc
        try:
            proc.wait(timeout=10 if proc.poll() is None else 1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class PendingCore:
    """A CO-RE load running in a thread of this process, started early (agent side).

    The CO-RE counterpart of :class:`PendingLoad`, with the same use: the agent starts it
    right after reading its configuration and the probe claims it with :meth:`result`.
    libbpf's work (parsing the kernel's BTF, relocating) and the kernel's (verifying,
    attaching) run in C with the GIL released (ctypes releases it around each call), so
    they overlap the agent's own imports, buffer and broker connect instead of following
    them: about a third of the CPU before the first report.
    """

    loader = "core"

    def __init__(self, req: LoadRequest, reason: str) -> None:
        self.request = req
        self._reason = reason
        self._hand: Handoff | None = None
        self._error: BaseException | None = None
        self._claimed = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._load, name="cfnet-bpf-load", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            self._hand = load_core(self.request, self._reason)
        except BaseException as exc:  # handed to whoever claims it, raised there
            self._error = exc
        finally:
            self._done.set()

    def result(self, timeout_s: float = LOADER_TIMEOUT_S) -> Handoff:
        """Wait for the load and take its descriptors (once); raises its ProbeError."""
        with self._lock:
            if self._claimed:
                raise ProbeError("CO-RE load already claimed or cancelled")
            self._claimed = True
        if not self._done.wait(timeout_s):
            # libbpf cannot be interrupted: the thread goes on, and what it attaches
            # stays until this process exits.
            raise ProbeError(f"CO-RE load did not finish in {timeout_s:.0f} s")
        if self._error is not None:
            if isinstance(self._error, ProbeError):
                raise ProbeError(str(self._error)) from self._error
            raise ProbeError(f"CO-RE load failed: {self._error!r}") from self._error
        hand, self._hand = self._hand, None
        assert hand is not None  # set when no error
        return hand

    def cancel(self) -> None:
        """Not needed after all: wait for the load (tens of milliseconds; libbpf cannot be
        stopped halfway) and detach and free what it attached. A no-op once claimed."""
        with self._lock:
            if self._claimed:
                return
            self._claimed = True
        if self._done.wait(LOADER_TIMEOUT_S):
            hand, self._hand = self._hand, None
            if hand is not None:
                hand.close()
        else:
            log.warning("CO-RE load still running after %.0f s; its attachments stay until "
                        "the agent exits", LOADER_TIMEOUT_S)


Pending = PendingLoad | PendingCore
"""A load started early, of either loader: the probe claims it (``result``) or drops it."""


def choose(bcc_fallback: bool = False) -> tuple[str, str]:
    """("core" or "bcc", why): CO-RE where it can work; BCC only where asked for.

    CO-RE needs the kernel's BTF, libbpf and the prebuilt object; where one is missing the
    reason names it and the fix. BCC compiles the C on the device, which needs a compiler
    and kernel headers there, the thing the CO-RE agent exists to avoid: it is used only
    when the operator asked, by ``bcc_fallback`` (the agent's ``bcc_fallback: true``, the
    agent-bcc image's default) or ``CFNET_BPF_LOADER=bcc``; otherwise an unusable CO-RE
    loader is a :class:`ProbeError` with that reason. Nothing is loaded here.
    """
    from edge_agent import libbpf_loader

    forced = (os.environ.get(ENV_LOADER) or "auto").strip().lower()
    if forced not in LOADERS:
        raise ProbeError(f"{ENV_LOADER}={forced!r}: one of {', '.join(LOADERS)}")
    if forced == "bcc":
        return "bcc", f"forced by {ENV_LOADER}=bcc"
    btf = libbpf_loader.btf_path()
    obj = libbpf_loader.object_path(bpf_dir())
    why = ""
    if not btf.exists():
        why = (f"no kernel BTF at {btf}: CO-RE needs a kernel built with "
               "CONFIG_DEBUG_INFO_BTF (use such a kernel, or the BCC loader)")
    elif not obj.is_file():
        why = (f"no CO-RE object at {obj}: install the agent from a wheel that carries it "
               "(building the wheel compiles it), or build it in a checkout with "
               "python -m tools.build_bpf")
    else:
        why = libbpf_loader.available()
    if not why:
        return "core", f"kernel BTF at {btf}"
    if forced == "core":
        raise ProbeError(f"CO-RE loader forced by {ENV_LOADER}=core but unusable: {why}")
    if bcc_fallback:
        return "bcc", why
    raise ProbeError(f"CO-RE loader unusable: {why}. The BCC loader (a compiler and kernel "
                     "headers on the device) is used only where asked for: bcc_fallback: "
                     "true (CFNET_BCC_FALLBACK=true), or the agent-bcc image")


def load_core(req: LoadRequest, reason: str = "") -> Handoff:
    """Load the prebuilt CO-RE object in this process (see :mod:`edge_agent.libbpf_loader`)."""
    from edge_agent import libbpf_loader
    from edge_agent.bpfsys import header_structs

    ensure_tracefs()  # libbpf finds a tracepoint's id in tracefs, as BCC does
    types = header_structs(bpf_dir() / "cfnet_links.h")
    cfg = types["cf_config"]()
    p = req.params
    cfg.filter_local = int(bool(p.get("filter_local", 0)))
    cfg.include_loopback = int(bool(p.get("include_loopback", 0)))
    cfg.probe_port = int(p.get("probe_port", 7946))
    peers = int(p.get("max_peers", 4096))
    core, maps, progs, links, events = libbpf_loader.load(
        libbpf_loader.object_path(bpf_dir()), config=bytes(cfg),
        max_entries={"peers": peers, "rtt_hist": peers * 16}, maps=list(req.maps))
    libbpf_loader.trim_heap()
    return Handoff(maps=maps, progs=progs, links=links, cflags=[], loader_pid=os.getpid(),
                   loader="core", reason=reason, kernel_counters=True, owner=core,
                   events=events)


def start_loader(req: LoadRequest) -> PendingLoad:
    """Start the loader process for ``req`` and return at once (see :class:`PendingLoad`)."""
    return PendingLoad(req)


def start_core(req: LoadRequest, reason: str = "") -> PendingCore:
    """Start the CO-RE load of ``req`` in a thread and return at once (:class:`PendingCore`)."""
    return PendingCore(req, reason)


def load_in_subprocess(req: LoadRequest, timeout_s: float = LOADER_TIMEOUT_S) -> Handoff:
    """Run the loader process and take over its descriptors (agent side; no BCC here)."""
    return start_loader(req).result(timeout_s)


def _serve(sock: socket.socket, req: LoadRequest) -> None:
    """Loader process body: compile, load, attach, send the descriptors, wait for the ack."""
    try:
        check_environment(req.tracepoints)
        cflags = list(req.cflags)
        if "err" in tracepoint_fields("tcp", "tcp_retransmit_skb"):
            cflags.append("-DCFNET_RETRANS_HAS_ERR")
        cflags += kernel_offset_cflags()
        bpf = load(req.source, cflags)
        maps = {name: bpf[name.encode()].map_fd for name in req.maps}
        progs = {name.decode(): fn.fd for name, fn in bpf.funcs.items()}
        links = list(bpf.tracepoint_fds.values())
    except Exception as exc:
        with contextlib.suppress(OSError):  # an agent that is gone needs no reason
            sock.send(json.dumps({"error": str(exc)}).encode())
        return
    fds: list[int] = []

    def idx(fd: int) -> int:
        fds.append(fd)
        return len(fds) - 1

    reply = {"maps": {k: idx(v) for k, v in maps.items()},
             "progs": {k: idx(v) for k, v in progs.items()},
             "links": [idx(v) for v in links], "cflags": cflags}
    try:
        socket.send_fds(sock, [json.dumps(reply).encode()], fds)
    except OSError:
        # The agent is gone (killed while we compiled, or it cancelled an early
        # load): nobody to hand over to; our exit closes the descriptors.
        return
    sock.settimeout(LOADER_TIMEOUT_S)
    with contextlib.suppress(OSError):
        sock.recv(16)  # the agent's ack (or EOF if it died: our exit then detaches all)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse  # the loader process's only: the agent's CO-RE path does without

    p = argparse.ArgumentParser(prog="python -m edge_agent.bpf_loader",
                                description="cfnet's one-shot BPF loader (started by the agent)")
    p.add_argument("--fd", type=int, required=True, help="Unix socket to hand descriptors to")
    p.add_argument("--request", required=True, help="LoadRequest as JSON")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="bpf-loader: %(message)s")
    sock = socket.socket(fileno=a.fd)
    try:
        _serve(sock, LoadRequest(**json.loads(a.request)))
    finally:
        sock.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: BCC's atexit cleanup would disable the perf events, and the
    # agent shares them (a passed descriptor is the same open file).
    os._exit(0)


if __name__ == "__main__":
    main()
