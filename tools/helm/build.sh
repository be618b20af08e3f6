#!/usr/bin/env bash
# Build `helm` (helm.sh/helm/v3) from the Go module proxy for the chart tests.
#
# Nothing is committed but this script: the binary lives in
#   ${CFNET_CACHE:-/var/cache/cfnet}/helm/<version>/helm
# keyed by version; a rerun is a no-op once it exists. `go install module@version` builds
# the release's own go.mod/go.sum (checked against the Go checksum database), so the binary
# is what `helm.sh` ships apart from the linker stamps set below.
#
# Usage: tools/helm/build.sh [--print-path]
#   CFNET_HELM_VERSION (default v3.21.4), CFNET_CACHE, CFNET_BUILD_JOBS (go build -p).
set -euo pipefail

HELM_VERSION="${CFNET_HELM_VERSION:-v3.21.4}"
DIR="${CFNET_CACHE:-/var/cache/cfnet}/helm/$HELM_VERSION"
BIN="$DIR/helm"
JOBS="${CFNET_BUILD_JOBS:-$(nproc)}"

if [[ "${1:-}" == "--print-path" ]]; then echo "$BIN"; exit 0; fi

log() { printf '[helm-build %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { log "go not found on PATH (nor in /usr/local/go/bin)"; exit 2; }

mkdir -p "$DIR"
exec 9>"$DIR/.build.lock"
if ! flock -n 9; then log "another build holds $DIR/.build.lock; waiting for it"; flock 9; fi
if [[ -x "$BIN" ]]; then log "helm $HELM_VERSION cached: $BIN"; echo "$BIN"; exit 0; fi

t0=$SECONDS
log "building helm $HELM_VERSION from the Go module proxy (-p $JOBS; ~600 packages, 2-6 min on 2 cores)"
# One line per compiled package with -v; show every 25th so progress is visible.
n=0
ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
while IFS= read -r line; do
  n=$((n + 1))
  if [[ "$line" == *.go:* || "$line" == "#"* || "$line" == go:* || "$line" == *" "* ]]; then
    printf '[helm] %s\n' "$line" >&2
  elif (( n % 25 == 0 )); then
    printf '[helm] %d packages compiled (last: %s)\n' "$n" "$line" >&2
  fi
done < <(GOBIN="$DIR/.gobin" GOFLAGS=-buildvcs=false go install -p "$JOBS" -trimpath \
           -ldflags "$ld" -v "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" 2>&1; echo "go: exit $?")
[[ -x "$DIR/.gobin/helm" ]] || { log "helm build failed (output above)"; exit 1; }
mv "$DIR/.gobin/helm" "$BIN"
rmdir "$DIR/.gobin" 2>/dev/null || true
log "helm $HELM_VERSION built in $((SECONDS - t0)) s: $BIN ($("$BIN" version --short))"
echo "$BIN"
