#!/usr/bin/env bash
# Build nats-server (the clustered bus's engine) from the Go module proxy.
#
# Nothing but this script is committed: the binary lives in
#   ${CFNET_CACHE:-/var/cache/cfnet}/nats/nats-server-<version>/nats-server
# keyed by version; a rerun is a no-op once it exists. `go install module@version`
# builds the upstream main package with the module's own go.mod and go.sum
# (checksums verified against sum.golang.org's database as for any module).
#
# Usage: tools/nats/build.sh [--print-path]   (prints the binary's path)
#   CFNET_NATS_VERSION (default v2.15.3), CFNET_CACHE (default /var/cache/cfnet),
#   CFNET_BUILD_JOBS (go build -p, default nproc).
set -euo pipefail

VERSION="${CFNET_NATS_VERSION:-v2.15.3}"
CACHE="${CFNET_CACHE:-/var/cache/cfnet}/nats"
DIR="$CACHE/nats-server-$VERSION"
BIN="$DIR/nats-server"
JOBS="${CFNET_BUILD_JOBS:-$(nproc)}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

if [[ "${1:-}" == "--print-path" ]]; then echo "$BIN"; exit 0; fi

log() { printf '[nats-build %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
command -v go >/dev/null || { log "go not found on PATH"; exit 2; }

# go build -v prints one line per package compiled: count them so progress shows.
progress() {
  local n=0 line
  while IFS= read -r line; do
    n=$((n + 1))
    if [[ "$line" == *.go:* || "$line" == "#"* || "$line" == go:* || "$line" == *" "* ]]; then
      printf '[nats-server] %s\n' "$line" >&2
    elif (( n % 20 == 0 )); then
      printf '[nats-server] %d packages compiled (last: %s)\n' "$n" "$line" >&2
    fi
  done
  printf '[nats-server] %d packages compiled\n' "$n" >&2
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.build.lock; waiting for it"
  flock 9
fi
if [[ -x "$BIN" ]]; then log "nats-server $VERSION cached: $BIN"; echo "$BIN"; exit 0; fi
T0=$SECONDS
mkdir -p "$DIR"
log "building github.com/nats-io/nats-server/v2@$VERSION from the module proxy (-p $JOBS)"
if ! GOBIN="$DIR/.tmp" go install -p "$JOBS" -trimpath -ldflags "-s -w" -v \
    "github.com/nats-io/nats-server/v2@$VERSION" 2>&1 | progress || [[ ! -x "$DIR/.tmp/nats-server" ]]; then
  log "nats-server build failed (output above)"; exit 1
fi
mv "$DIR/.tmp/nats-server" "$BIN"
rmdir "$DIR/.tmp" 2>/dev/null || true
log "nats-server $VERSION built in $((SECONDS - T0)) s: $BIN"
echo "$BIN"
