#!/usr/bin/env bash
# Build the test cluster (kube-apiserver + etcd, and kube-controller-manager, kube-scheduler,
# kubelet and kube-proxy from the same k8s.io/kubernetes module; kwok and CoreDNS from their
# own modules) from the Go module proxy.
#
# Nothing here is committed but this script: the wrapper modules and the binaries live in
#   ${CFNET_CACHE:-/var/cache/cfnet}/envtest/k8s-<version>/      (kube-apiserver,
#                                       kube-controller-manager, kube-scheduler)
#   ${CFNET_CACHE:-/var/cache/cfnet}/envtest/etcd-<version>/     (etcd)
#   ${CFNET_CACHE:-/var/cache/cfnet}/envtest/kwok-<version>/     (kwok, the controller only)
#   ${CFNET_CACHE:-/var/cache/cfnet}/envtest/coredns-<version>/  (coredns, cluster-DNS plugins)
# keyed by version, and a rerun is a no-op once the binaries exist.
#
# kube-apiserver: a wrapper module requires k8s.io/kubernetes@<version> and replaces every
# staging module (the `=> ./staging/src/...` replaces of that version's own go.mod) with its
# published v0.<minor>.<patch>. etcd: a wrapper module whose main calls
# go.etcd.io/etcd/server/v3/etcdmain.Main.
#
# kube-controller-manager and kube-scheduler are built from the same wrapper module once
# kube-apiserver is; they share its build cache, so each takes a minute or two on 2 cores.
#
# kubelet and kube-proxy (the real node of tools/envtest/node.py) come from the same wrapper
# module too. kwok: a wrapper module requiring sigs.k8s.io/kwok, building cmd/kwok only.
# CoreDNS: a wrapper main that registers only the plugins a cluster DNS needs (kubernetes,
# forward, cache, errors, health, ready, loop, reload, loadbalance, log), not all ~60 of
# core/plugin, which keeps the compile short.
#
# Usage: tools/envtest/build.sh [--print-dir]   (prints apiserver, etcd, controller-manager,
#                                                scheduler, kubelet, kube-proxy, kwok,
#                                                coredns paths, one a line)
#   CFNET_ENVTEST_ONLY=control-plane builds only the first four (what a test without a node
#   needs), =control-plane+kwok those and kwok (tests/k8s's simulated nodes); the default
#   builds all.
#   CFNET_K8S_VERSION (default v1.34.4), CFNET_ETCD_VERSION (default v3.6.16),
#   CFNET_KWOK_VERSION (default v0.8.0), CFNET_COREDNS_VERSION (default v1.14.7),
#   CFNET_CACHE (default /var/cache/cfnet), CFNET_BUILD_JOBS (go build -p, default nproc).
set -euo pipefail

K8S_VERSION="${CFNET_K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${CFNET_ETCD_VERSION:-v3.6.16}"
CACHE="${CFNET_CACHE:-/var/cache/cfnet}/envtest"
K8S_DIR="$CACHE/k8s-$K8S_VERSION"
ETCD_DIR="$CACHE/etcd-$ETCD_VERSION"
KWOK_VERSION="${CFNET_KWOK_VERSION:-v0.8.0}"
COREDNS_VERSION="${CFNET_COREDNS_VERSION:-v1.14.7}"
KWOK_DIR="$CACHE/kwok-$KWOK_VERSION"
COREDNS_DIR="$CACHE/coredns-$COREDNS_VERSION"
ONLY="${CFNET_ENVTEST_ONLY:-all}"
JOBS="${CFNET_BUILD_JOBS:-$(nproc)}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
[[ "$GOFLAGS" == *-buildvcs=false* ]] || export GOFLAGS="$GOFLAGS -buildvcs=false"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$K8S_DIR/bin/kube-apiserver"
  echo "$ETCD_DIR/bin/etcd"
  echo "$K8S_DIR/bin/kube-controller-manager"
  echo "$K8S_DIR/bin/kube-scheduler"
  echo "$K8S_DIR/bin/kubelet"
  echo "$K8S_DIR/bin/kube-proxy"
  echo "$KWOK_DIR/bin/kwok"
  echo "$COREDNS_DIR/bin/coredns"
  exit 0
fi

log() { printf '[envtest-build %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
command -v go >/dev/null || { log "go not found on PATH"; exit 2; }

# go build -v prints one line per package it compiles; count them so progress is visible,
# and pass anything else (errors: "file.go:1:2: ...", "# pkg", "go: ...") through whole.
progress() {
  local what="$1" n=0 line
  while IFS= read -r line; do
    n=$((n + 1))
    if [[ "$line" == *.go:* || "$line" == "#"* || "$line" == go:* || "$line" == *" "* ]]; then
      printf '[%s] %s\n' "$what" "$line" >&2  # compiler or go command output, not a package
    elif (( n % 25 == 0 )); then
      printf '[%s] %d packages compiled (last: %s)\n' "$what" "$n" "$line" >&2
    fi
  done
  printf '[%s] %d packages compiled\n' "$what" "$n" >&2
}

# The wrapper module's tools.go: pins every control-plane main package into the module graph.
write_tools_go() {
  cat > tools.go <<'GO'
//go:build tools

// Package tools pins the control plane's main packages into the module graph.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
}

# Linker flags for the k8s.io/kubernetes commands: stripped, version stamped.
k8s_ldflags() {
  local minor
  minor="$(cut -d. -f2 <<<"$K8S_VERSION")"
  printf '%s' "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  printf '%s' " -X k8s.io/component-base/version.gitMajor=1"
  printf '%s' " -X k8s.io/component-base/version.gitMinor=$minor"
  printf '%s' " -X k8s.io/component-base/version.gitTreeState=clean"
  printf '%s' " -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
}

build_apiserver() {
  local bin="$K8S_DIR/bin/kube-apiserver"
  if [[ -x "$bin" ]]; then log "kube-apiserver $K8S_VERSION cached: $bin"; return 0; fi
  local t0=$SECONDS minor patch stagever
  mkdir -p "$K8S_DIR/src" "$K8S_DIR/bin"
  cd "$K8S_DIR/src"
  minor="$(cut -d. -f2 <<<"$K8S_VERSION")"; patch="$(cut -d. -f3 <<<"$K8S_VERSION")"
  stagever="v0.$minor.$patch"

  log "fetching k8s.io/kubernetes@$K8S_VERSION go.mod from the module proxy"
  local gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  [[ -f "$gomod" ]] || { log "could not download go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  local gover
  gover="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod" | head -1)"

  # Every staging module is a `k8s.io/<name> => ./staging/src/k8s.io/<name>` replace upstream.
  local staging
  staging="$(sed -n 's#^\s*\(k8s.io/[A-Za-z0-9._-]*\)\s*=>\s*\./staging/.*#\1#p' "$gomod" | sort -u)"
  [[ -n "$staging" ]] || { log "no staging replaces found in $gomod"; exit 1; }
  log "$(wc -l <<<"$staging") staging modules -> $stagever"

  {
    echo "// Generated by cfnet tools/envtest/build.sh; do not edit."
    echo "module cfnet.local/envtest/apiserver"
    echo
    echo "go $gover"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    while IFS= read -r m; do echo "	$m => $m $stagever"; done <<<"$staging"
    echo ")"
  } > go.mod
  write_tools_go
  log "resolving the module graph (go mod tidy; first run downloads several hundred MB)"
  go mod tidy -e 2>&1 | grep -v '^go: finding\|^go: downloading' >&2 || true
  go mod download -x >/dev/null 2>&1 || true

  local ld
  ld="$(k8s_ldflags)"
  log "compiling kube-apiserver $K8S_VERSION (-p $JOBS; about 1720 packages: 4-15 min on 2 cores)"
  if ! go build -p "$JOBS" -trimpath -ldflags "$ld" -v -o "$bin.tmp" \
      k8s.io/kubernetes/cmd/kube-apiserver 2>&1 | progress kube-apiserver || [[ ! -x "$bin.tmp" ]]; then
    log "kube-apiserver build failed (output above)"; exit 1
  fi
  mv "$bin.tmp" "$bin"
  log "kube-apiserver built in $((SECONDS - t0)) s: $bin"
}

# kube-controller-manager / kube-scheduler: same wrapper module, same flags, after the API
# server (whose module graph and build cache they reuse).
build_component() {
  local name="$1" bin="$K8S_DIR/bin/$1"
  if [[ -x "$bin" ]]; then log "$name $K8S_VERSION cached: $bin"; return 0; fi
  local t0=$SECONDS
  cd "$K8S_DIR/src"
  if ! grep -q "cmd/$name" tools.go 2>/dev/null; then
    log "$name is not in the wrapper module yet: adding it (go mod tidy)"
    write_tools_go
    go mod tidy -e 2>&1 | grep -v '^go: finding\|^go: downloading' >&2 || true
  fi
  local ld
  ld="$(k8s_ldflags)"
  log "compiling $name $K8S_VERSION (-p $JOBS; reuses kube-apiserver's build cache)"
  if ! go build -p "$JOBS" -trimpath -ldflags "$ld" -v -o "$bin.tmp" \
      "k8s.io/kubernetes/cmd/$name" 2>&1 | progress "$name" || [[ ! -x "$bin.tmp" ]]; then
    log "$name build failed (output above)"; exit 1
  fi
  mv "$bin.tmp" "$bin"
  log "$name built in $((SECONDS - t0)) s: $bin"
}

build_etcd() {
  local bin="$ETCD_DIR/bin/etcd"
  if [[ -x "$bin" ]]; then log "etcd $ETCD_VERSION cached: $bin"; return 0; fi
  local t0=$SECONDS
  mkdir -p "$ETCD_DIR/src" "$ETCD_DIR/bin"
  cd "$ETCD_DIR/src"
  local gomod gover
  gomod="$(go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  gover="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod" | head -1)"
  {
    echo "// Generated by cfnet tools/envtest/build.sh; do not edit."
    echo "module cfnet.local/envtest/etcd"
    echo
    echo "go ${gover:-1.24}"
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  } > go.mod
  cat > main.go <<'GO'
// Command etcd is the upstream etcd server main, built from go.etcd.io/etcd/server/v3.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "resolving etcd $ETCD_VERSION module graph"
  go mod tidy 2>&1 | grep -v '^go: finding\|^go: downloading' >&2 || true
  log "compiling etcd $ETCD_VERSION"
  if ! go build -p "$JOBS" -trimpath -ldflags "-s -w" -v -o "$bin.tmp" . 2>&1 | progress etcd \
      || [[ ! -x "$bin.tmp" ]]; then
    log "etcd build failed (output above)"; exit 1
  fi
  mv "$bin.tmp" "$bin"
  log "etcd built in $((SECONDS - t0)) s: $bin"
}

# A wrapper module around one main package of another module: $1 name, $2 dir, $3 module,
# $4 version, $5 package to build (or "." with main.go from stdin).
build_wrapped() {
  local name="$1" dir="$2" mod="$3" ver="$4" pkg="$5" bin="$2/bin/$1"
  if [[ -x "$bin" ]]; then log "$name $ver cached: $bin"; [[ "$pkg" != "." ]] || cat >/dev/null; return 0; fi
  local t0=$SECONDS gomod gover
  mkdir -p "$dir/src" "$dir/bin"
  cd "$dir/src"
  gomod="$(go mod download -json "$mod@$ver" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  [[ -f "$gomod" ]] || { log "could not download go.mod of $mod@$ver"; exit 1; }
  gover="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod" | head -1)"
  {
    echo "// Generated by cfnet tools/envtest/build.sh; do not edit."
    echo "module cfnet.local/envtest/$name"
    echo
    echo "go ${gover:-1.25}"
    echo
    echo "require $mod $ver"
  } > go.mod
  if [[ "$pkg" == "." ]]; then cat > main.go; else
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
  fi
  log "resolving $name $ver module graph"
  go mod tidy -e 2>&1 | grep -v '^go: finding\|^go: downloading' >&2 || true
  log "compiling $name $ver (-p $JOBS)"
  if ! go build -p "$JOBS" -trimpath -ldflags "-s -w" -v -o "$bin.tmp" "$pkg" 2>&1 \
      | progress "$name" || [[ ! -x "$bin.tmp" ]]; then
    log "$name build failed (output above)"; exit 1
  fi
  mv "$bin.tmp" "$bin"
  log "$name built in $((SECONDS - t0)) s: $bin"
}

# kwok has no built-in stages: its own "fast" stage files (nodes initialised and heartbeating
# with a Lease; pods Running/Ready at once, completed, terminating pods removed at once: no
# random delays, so tests and benchmarks measure cfnet, not kwok's jitter) are copied from
# its module into stages-fast.yaml, the --config the harness passes.
build_kwok() {
  build_wrapped kwok "$KWOK_DIR" sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
  [[ -s "$KWOK_DIR/stages-fast.yaml" ]] && return 0
  local src f
  src="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",\?$/\1/p')"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
      pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"; cat "$src/kustomize/stage/$f"
  done > "$KWOK_DIR/stages-fast.yaml.tmp"
  mv "$KWOK_DIR/stages-fast.yaml.tmp" "$KWOK_DIR/stages-fast.yaml"
  log "kwok stages: $KWOK_DIR/stages-fast.yaml"
}

# CoreDNS with the cluster-DNS plugins only. The directive order stays upstream's
# (dnsserver.Directives); a directive whose plugin is not linked in is simply unused.
build_coredns() {
  build_wrapped coredns "$COREDNS_DIR" github.com/coredns/coredns "$COREDNS_VERSION" . <<'GO'
// Command coredns is upstream CoreDNS with only the plugins a cluster DNS needs.
package main

import (
	_ "github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }
GO
}

# Two test sessions may start at once: one builds, the other waits and then finds the binaries.
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.build.lock; waiting for it"
  flock 9
fi
T0=$SECONDS
build_etcd
build_apiserver
build_component kube-controller-manager
build_component kube-scheduler
if [[ "$ONLY" == all ]]; then
  build_component kubelet
  build_component kube-proxy
  build_kwok
  build_coredns
elif [[ "$ONLY" == control-plane+kwok ]]; then
  build_kwok
fi
log "test cluster binaries ready in $((SECONDS - T0)) s"
echo "$K8S_DIR/bin/kube-apiserver"
echo "$ETCD_DIR/bin/etcd"
echo "$K8S_DIR/bin/kube-controller-manager"
echo "$K8S_DIR/bin/kube-scheduler"
if [[ "$ONLY" == all ]]; then
  echo "$K8S_DIR/bin/kubelet"
  echo "$K8S_DIR/bin/kube-proxy"
fi
[[ "$ONLY" == control-plane ]] || echo "$KWOK_DIR/bin/kwok"
[[ "$ONLY" != all ]] || echo "$COREDNS_DIR/bin/coredns"
