#!/usr/bin/env bash
# Install the cfnet edge agent on a plain Debian/Ubuntu host, from the built wheel:
#
#   sudo deploy/systemd/install-agent.sh dist/cfnet-0.1.0-py3-none-any.whl [--start]
#
# 1. apt: python3-venv and libbpf1 (the agent loads its prebuilt CO-RE object with it; no
#    compiler); with CFNET_WITH_BCC=1 also python3-bpfcc, the fallback for kernels without BTF
#    (BCC is Debian's, built for its python3);
# 2. a venv in $CFNET_PREFIX (/opt/cfnet) with the wheel and its agent dependencies, BCC (when
#    installed) linked in from dist-packages (not --system-site-packages: that would drag in
#    every Debian module);
# 3. the BPF object and sources into $CFNET_PREFIX/bpf (the unit points CFNET_BPF_DIR there);
# 4. the unit into $SYSTEMD_DIR (/etc/systemd/system) with the prefix filled in, and an
#    agent.yaml skeleton into $CFNET_CONFIG_DIR (/etc/cfnet-agent) unless one is there;
# 5. with --start: systemctl daemon-reload and enable --now.
# Rerunning upgrades in place. CFNET_NO_APT=1 skips step 1 (tests; hosts with the packages).
set -euo pipefail
unset PYTHONPATH PYTHONHOME  # the venv must stand on its own
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WHEEL="${1:?usage: install-agent.sh WHEEL [--start]}"
PREFIX="${CFNET_PREFIX:-/opt/cfnet}"
UNIT_DIR="${SYSTEMD_DIR:-/etc/systemd/system}"
CONF_DIR="${CFNET_CONFIG_DIR:-/etc/cfnet-agent}"
say() { printf '[install-agent] %s\n' "$*" >&2; }

[[ -f "$WHEEL" ]] || { say "no wheel at $WHEEL (build one: python3 -m pip wheel --no-deps -w dist .)"; exit 2; }
if [[ -z "${CFNET_NO_APT:-}" ]]; then
  missing=()
  pkgs=(python3-venv libbpf1)
  [[ -n "${CFNET_WITH_BCC:-}" ]] && pkgs+=(python3-bpfcc)
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    say "apt: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

[[ -x "$PREFIX/bin/python" ]] || { /usr/bin/python3 -m venv "$PREFIX"; say "venv: created $PREFIX"; }
# The agent extra where the wheel has one (pip ignores an unknown extra with a warning).
if ! out="$("$PREFIX/bin/pip" install -q --upgrade "$(realpath "$WHEEL")[agent]" 2>&1)"; then
  printf '%s\n' "$out" >&2; say "pip install of $WHEEL failed"; exit 1
fi
printf '%s\n' "$out" | grep -v "does not provide the extra" | grep . >&2 || true
"$PREFIX/bin/python" -I -c 'import edge_agent' || { say "edge_agent not importable in $PREFIX"; exit 1; }
SITE="$("$PREFIX/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ -d /usr/lib/python3/dist-packages/bcc ]]; then
  ln -sfn /usr/lib/python3/dist-packages/bcc "$SITE/bcc"
fi
say "venv: $(basename "$WHEEL") installed in $PREFIX"

mkdir -p "$PREFIX/bpf"
found=0
for d in "$SITE/edge_agent/bpf" "$REPO/edge_agent/bpf" "$REPO/bpf"; do
  if compgen -G "$d/*.c" >/dev/null; then
    cp "$d"/*.c "$d"/*.h "$PREFIX/bpf/"
    if compgen -G "$d/obj/*.bpf.o" >/dev/null; then
      mkdir -p "$PREFIX/bpf/obj"; cp "$d"/obj/*.bpf.o "$PREFIX/bpf/obj/"
    fi
    found=1; break
  fi
done
((found)) || { say "BPF sources not found (wheel or checkout)"; exit 1; }
if [[ -e "$PREFIX/bpf/obj/tcp_links.bpf.o" ]]; then
  say "bpf: CO-RE object and sources in $PREFIX/bpf"
else
  say "bpf: sources in $PREFIX/bpf, no CO-RE object in the wheel (the agent will need BCC: CFNET_WITH_BCC=1)"
fi

mkdir -p "$UNIT_DIR" "$CONF_DIR"
sed "s#/opt/cfnet#$PREFIX#g; s#/etc/cfnet-agent/agent.yaml#$CONF_DIR/agent.yaml#g" \
  "$HERE/cfnet-agent.service" > "$UNIT_DIR/cfnet-agent.service"
say "unit: $UNIT_DIR/cfnet-agent.service"
if [[ ! -e "$CONF_DIR/agent.yaml" ]]; then
  cat > "$CONF_DIR/agent.yaml" <<YAML
# cfnet agent configuration (every key is also a --flag and a CFNET_<NAME> variable).
broker_host: broker.example.org
broker_port: 8883
tls: true
ca_file: $CONF_DIR/ca.crt
password_file: $CONF_DIR/password
interval_s: 1.0
ebpf: true
# BCC (compiles on this host) where the CO-RE object cannot load: only with CFNET_WITH_BCC=1.
bcc_fallback: $([[ -n "${CFNET_WITH_BCC:-}" ]] && echo true || echo false)
# a port for /healthz, /readyz, /status (the loader in use and why) and /metrics; 0: none
metrics_port: 0
buffer_path: /var/lib/cfnet-agent/buffer.db
YAML
  chmod 0640 "$CONF_DIR/agent.yaml"
  say "config: wrote $CONF_DIR/agent.yaml (set broker_host; put ca.crt and password beside it)"
fi
if [[ "${2:-}" == "--start" ]]; then
  systemctl daemon-reload
  systemctl enable --now cfnet-agent.service
  say "started: systemctl status cfnet-agent"
fi
