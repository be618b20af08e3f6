#!/usr/bin/env bash
# One-shot, idempotent setup of a fresh Debian 12 machine (as root) for cfnet:
# apt packages, the virtual environment, tracefs, the CO-RE BPF object, and (for the BCC
# fallback's tests only) kernel headers.
# Every step says what it did, or that there was nothing to do.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${CFNET_VENV:-$ROOT/.venv}
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

APT_PKGS=(mosquitto mosquitto-clients python3-bpfcc bpfcc-tools libbpfcc nftables iproute2
          python3-venv python3-dev iperf3 sqlite3 openssl ca-certificates procps kmod
          chromium   # chromium: headless checks of `cfnetctl map`
          # images (tests/deploy): mmdebstrap makes the base, podman/buildah build and run the
          # Containerfile (runc: crun refuses this kernel's cgroup v1/v2 hybrid), umoci/skopeo
          # unpack and copy images where podman cannot run one
          mmdebstrap podman buildah runc umoci skopeo uidmap
          # the test cluster's real node (tools/envtest/node.py): containerd 1.6 runs the
          # pods through runc, the CNI plugins wire them (bridge, host-local, loopback,
          # portmap), kube-proxy writes iptables rules and needs conntrack
          containerd containernetworking-plugins iptables conntrack
          # the CO-RE BPF object (tools/build_bpf.py): clang/llvm compile it once against a
          # vmlinux.h that bpftool generates from BTF; libbpf1 loads it (the agent, via ctypes)
          clang llvm bpftool libbpf-dev libbpf1
          # promtool checks and unit-tests the chart's alerting rules (tests/deploy); the
          # test cluster's Prometheus scrapes cfnet through Kubernetes service discovery
          prometheus
          # arm64 images (tools/images.sh): mmdebstrap --arch arm64 runs the arm64 dpkg under qemu
          qemu-user-static binfmt-support arch-test)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || say "apt-get update failed; trying the cached lists"
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
else
  say "apt: all ${#APT_PKGS[@]} packages already installed"
fi
# The packaged broker must not hold port 1883: tests and the demo start their own.
if systemctl is-active --quiet mosquitto 2>/dev/null; then
  systemctl stop mosquitto && systemctl disable mosquitto >/dev/null 2>&1 || true
  say "mosquitto: stopped the system service (tests and demo run their own brokers)"
fi
# Nor the packaged Prometheus 9090: the tests run promtool, and their own Prometheus.
if systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus && systemctl disable prometheus >/dev/null 2>&1 || true
  say "prometheus: stopped the system service (tests run promtool and their own server)"
fi

# --- kernel headers: for the BCC fallback's tests only -----------------------
# The agent's default loader (CO-RE: a prebuilt object that libbpf relocates against the
# kernel's BTF) needs no kernel headers, and nothing below is needed to run it. The BCC
# fallback, for kernels without BTF, compiles its C at load time against
# /lib/modules/$(uname -r)/build; `make test` runs the probe tests with both loaders, so
# this machine needs that too. This kernel has no headers package of its own, so we link
# the nearest Debian one. That is safe only because bpf/*.c takes no layout from these
# headers: tracepoint arguments (layout from tracefs at load time), our own map structs,
# and four kernel fields at offsets from the running kernel's BTF.
# CFNET_SETUP_BCC=0 skips it (a machine that runs only the CO-RE path).
KREL=$(uname -r)
KBUILD=/lib/modules/$KREL/build
KSRC=/lib/modules/$KREL/source
if [[ ${CFNET_SETUP_BCC:-1} == 0 ]]; then
  say "kernel headers (BCC fallback tests): skipped, CFNET_SETUP_BCC=0"
elif [[ -e $KBUILD/include/generated/autoconf.h && -e $KSRC/include/linux/kconfig.h ]]; then
  say "kernel headers (BCC fallback tests): $KBUILD and $KSRC present"
else
  if ! ls -d /usr/src/linux-headers-*-common >/dev/null 2>&1; then
    say "kernel headers (BCC fallback tests): installing linux-headers-amd64 (no package exists for $KREL)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q linux-headers-amd64 >/dev/null
  fi
  NEAREST=$(ls -d /usr/src/linux-headers-*-amd64 | grep -v -- '-rt-\|cloud' | sort -V | tail -1)
  COMMON=${NEAREST%-amd64}-common
  mkdir -p "/lib/modules/$KREL"
  ln -sfn "$NEAREST" "$KBUILD"
  ln -sfn "$COMMON" "$KSRC"
  say "kernel headers (BCC fallback tests): no package for $KREL; linked build -> $NEAREST, source -> $COMMON"
  say "kernel headers: safe because the BPF programs take no layout from them (see docs/probes.md)"
fi

# --- tracefs ----------------------------------------------------------------
if [[ -e /sys/kernel/tracing/events ]]; then
  say "tracefs: mounted at /sys/kernel/tracing"
else
  mount -t tracefs nodev /sys/kernel/tracing && say "tracefs: mounted /sys/kernel/tracing"
fi
if [[ ! -e /sys/kernel/debug/tracing/events ]]; then
  mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
  [[ -e /sys/kernel/debug/tracing/events ]] || mount -t tracefs nodev /sys/kernel/debug/tracing 2>/dev/null || true
  say "tracefs: made /sys/kernel/debug/tracing available (BCC 0.26 looks there)"
fi
[[ -e /sys/kernel/btf/vmlinux ]] && say "BTF: /sys/kernel/btf/vmlinux present" || say "BTF: absent (agent will use the sock_diag probe)"

# --- virtual environment ----------------------------------------------------
# Debian's python3 (not pyenv's), because python3-bpfcc is built for it. Only the
# bcc package is linked in from dist-packages: --system-site-packages would drag
# every Debian Python package into the venv.
if [[ ! -x $VENV/bin/python ]]; then
  /usr/bin/python3 -m venv "$VENV"
  say "venv: created $VENV"
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn /usr/lib/python3/dist-packages/bcc "$SITE/bcc"
STAMP=$VENV/.cfnet-installed
if [[ ! -e $STAMP || pyproject.toml -nt $STAMP ]]; then
  say "venv: installing cfnet and its dependencies (pip)"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  # compat mode: a plain path entry, so packages added later import without a reinstall
  "$VENV/bin/pip" install -q -e ".[core,dev]" --config-settings editable_mode=compat
  touch "$STAMP"
else
  say "venv: dependencies up to date"
fi
"$VENV/bin/python" -c 'import bcc, paho.mqtt, ortools, kubernetes, pyroute2, psutil, cryptography' \
  && say "venv: bcc, paho-mqtt, ortools, kubernetes, pyroute2, psutil, cryptography import fine"
# --- arm64 emulation (the arm64 images: mmdebstrap's dpkg, and running their entrypoint) ---
# qemu-user-static's binfmt entry, with the F flag (the interpreter is opened now, so it works
# inside chroots and containers). No systemd here to do it at boot.
if [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
fi
if [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
  say "binfmt: qemu-aarch64 registered"
elif update-binfmts --enable qemu-aarch64 2>/dev/null; then
  say "binfmt: registered qemu-aarch64 (arm64 images run under emulation)"
else
  say "binfmt: could not register qemu-aarch64; the arm64 image tests will say so"
fi

# --- the CO-RE BPF object ----------------------------------------------------
# bpf/obj/tcp_links.bpf.o: clang -target bpf against a vmlinux.h generated from this
# kernel's BTF (tools/build_bpf.py; a no-op while it is newer than its sources; ~5-20 s cold).
if [[ -e /sys/kernel/btf/vmlinux ]]; then
  "$VENV/bin/python" -m tools.build_bpf | sed 's/^/[setup] /'
else
  say "bpf: no BTF on this machine, CO-RE object not built (the agent will use BCC)"
fi
# --- Go (builds kube-apiserver and etcd for the Kubernetes tests) -----------
if command -v go >/dev/null; then
  say "go: $(go version | cut -d' ' -f3) (the Kubernetes tests build kube-apiserver/etcd with it)"
else
  say "go: NOT FOUND — the Kubernetes tests need Go >= 1.24 to build kube-apiserver and etcd"
  say "go: Debian 12's golang is too old; install the official toolchain into /usr/local/go"
fi
say "done"
