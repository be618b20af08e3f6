#!/usr/bin/env bash
# Build cfnet's OCI images (Containerfile targets `core`, `agent` (CO-RE) and `agent-bcc`) here, without Docker
# and without a registry: the base the Containerfile's FROM names is made by mmdebstrap (a
# Debian 12 rootfs), imported into podman's store under that same name, and the images are
# then built from the unchanged Containerfile by `podman build` (buildah).
#
#   tools/images.sh base            the base image (cached; a no-op when present)
#   tools/images.sh build [core|agent|agent-bcc|all]   base, then the image(s); prints names
#   tools/images.sh build mosquitto   the chart's broker from Debian's mosquitto (not in `all`:
#       only the test cluster's helm install needs it; clusters pull eclipse-mosquitto)
#   tools/images.sh build nats   the chart's NATS server: tools/nats/build.sh's nats-server
#       (Go module proxy) on the base (not in `all`: for the test cluster, as mosquitto)
#   tools/images.sh sizes           uncompressed and gzip-compressed sizes of the images
#   tools/images.sh build-arm64 [core|agent|all]   the arm64 images (see below); prints names
#   tools/images.sh sizes-arm64     their sizes
#
# arm64 (cfnet-core-arm64, cfnet-agent-arm64): the base is `mmdebstrap --arch arm64` with the
# runtime packages included (python3-minimal, libpython3.11-stdlib, libbpf1, openssl; dpkg's maintainer
# scripts run under Debian's qemu-user-static, the only emulated step). The Python layer is
# made on this host, without running pip under emulation: `pip install --target --platform
# manylinux2014_aarch64 --only-binary=:all:` of the same requirement lists, laid out as the
# amd64 images' virtual environments, and cfnet's own wheel (pure Python). The image is then
# `podman build --arch arm64` of the Containerfile's *-prebuilt targets, which only COPY.
# The BPF object is the amd64 one: it is arch-neutral (tools/build_bpf.py says why, and a test
# compiles it for both arches and compares).
# The agents' CO-RE object is built first on this host (python -m tools.build_bpf).
#
# Caches, all outside the repository and keyed by content:
#   ${CFNET_CACHE:-/var/cache/cfnet}/images/base-<key>.tar   the mmdebstrap rootfs; <key> is a
#       hash of the suite, variant and package list below, so changing them makes a new base;
#   podman's own store (/var/lib/containers): the base and the images' layers. A rebuild with
#       unchanged pyproject.toml reuses the dependency layers (a source change rebuilds the
#       small `app` stage only); an image a rebuild replaces is removed.
# Environment: CFNET_CA_BUNDLE (a CA bundle pip trusts while building, passed as the build
#   secret pip-ca; default $PIP_CERT or the host bundle), CFNET_BASE (default
#   docker.io/library/debian:bookworm-slim, the Containerfile's own default), CFNET_IMAGE_TAG
#   (default: the version in pyproject.toml), CFNET_MIRROR (Debian mirror for mmdebstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${CFNET_CACHE:-/var/cache/cfnet}/images"
BASE="${CFNET_BASE:-docker.io/library/debian:bookworm-slim}"
MIRROR="${CFNET_MIRROR:-http://deb.debian.org/debian}"
TAG="${CFNET_IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}"
SUITE=bookworm
CA_BUNDLE="${CFNET_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"
# What debian:bookworm-slim is: minbase, no docs, man pages or translations.
DPKG_OPTS=(--dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
           --dpkgopt='path-include=/usr/share/doc/*/copyright'
           --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*')
# mmdebstrap may merge /usr with the usrmerge package, which pulls in full perl (50 MB); with
# usr-is-merged included it should not, and whatever of these is there goes again (the merge
# stays once done; dpkg ignores a package that is not installed).
PURGE=(usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl
       perl-modules-5.36 libperl5.36)
log() { printf '[images %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
# podman commands that change the image store (import, build, rmi), one at a time across
# processes: the amd64 and arm64 builds run side by side (tests/deploy/conftest.py), and a
# `--layers` build that looks up its cache while another process removes an image fails with
# "getting top layer info: layer not known" (CI, podman 4.3). Reads need no lock.
STORE_LOCK="${CFNET_PODMAN_LOCK:-/run/lock/cfnet-podman-store.lock}"
store() { mkdir -p "$(dirname "$STORE_LOCK")"; flock "$STORE_LOCK" podman "$@"; }

base_key() { printf '%s\n' "$SUITE" minbase usr-is-merged updates security "$MIRROR" "${DPKG_OPTS[@]}" "${PURGE[@]}" | sha256sum | cut -c1-12; }

ensure_base() {
  if podman image exists "$BASE"; then log "base $BASE present in podman's store"; return 0; fi
  local tar
  tar="$CACHE/base-$SUITE-$(base_key).tar"
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.base.lock"
  flock 8
  if [[ ! -s "$tar" ]]; then
    command -v mmdebstrap >/dev/null || { log "mmdebstrap missing (make setup installs it)"; exit 2; }
    log "mmdebstrap: Debian $SUITE minbase rootfs -> $tar (first run only; ~1-2 min)"
    local t0=$SECONDS
    mmdebstrap --quiet --variant=minbase --format=tar "${DPKG_OPTS[@]}" --include=usr-is-merged \
      --aptopt='Acquire::Retries "3"' \
      --customize-hook="chroot \"\$1\" dpkg --purge ${PURGE[*]}" \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
      "$SUITE" "$tar.tmp" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
      "deb ${MIRROR%/debian}/debian-security $SUITE-security main"
    mv "$tar.tmp" "$tar"
    log "mmdebstrap done in $((SECONDS - t0)) s ($(du -m "$tar" | cut -f1) MB)"
  else
    log "base rootfs cached: $tar"
  fi
  store import --quiet --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tar" "$BASE" >/dev/null
  log "imported $tar as $BASE"
}

ARM_PKGS=(python3-minimal libpython3.11-stdlib libbpf1 openssl)
ARM_BASE=localhost/cfnet-base-arm64:$SUITE
arm_key() { printf '%s\n' "$(base_key)" arm64 "${ARM_PKGS[@]}" | sha256sum | cut -c1-12; }

ensure_base_arm64() {
  local tar t0=$SECONDS
  tar="$CACHE/base-$SUITE-arm64-$(arm_key).tar"
  mkdir -p "$CACHE"
  exec 8>"$CACHE/.base-arm64.lock"  # its own: the amd64 build may run beside it
  flock 8
  if podman image exists "$ARM_BASE" && [[ -s "$tar" ]] && \
     [[ $(podman image inspect --format '{{.Labels.key}}' "$ARM_BASE" 2>/dev/null) == "$(arm_key)" ]]; then
    log "arm64 base $ARM_BASE present"; return 0
  fi
  if [[ ! -s "$tar" ]]; then
    [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || {
      log "qemu-aarch64 is not registered with binfmt_misc (tools/setup.sh does it)"; exit 2; }
    log "mmdebstrap --arch arm64: Debian $SUITE minbase + ${ARM_PKGS[*]} -> $tar (first run only; dpkg under qemu)"
    mmdebstrap --quiet --arch=arm64 --variant=minbase --format=tar "${DPKG_OPTS[@]}" \
      --include="usr-is-merged,$(IFS=,; echo "${ARM_PKGS[*]}")" \
      --aptopt='Acquire::Retries "3"' \
      --customize-hook="chroot \"\$1\" dpkg --purge ${PURGE[*]}" \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/apt "$1"/var/log/dpkg.log' \
      "$SUITE" "$tar.tmp" "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
      "deb ${MIRROR%/debian}/debian-security $SUITE-security main"
    mv "$tar.tmp" "$tar"
    log "mmdebstrap arm64 done in $((SECONDS - t0)) s ($(du -m "$tar" | cut -f1) MB)"
  fi
  store import --quiet --arch arm64 --change 'CMD ["bash"]' --change "LABEL key=$(arm_key)" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tar" "$ARM_BASE" >/dev/null
  log "imported $tar as $ARM_BASE"
}

# The Python layer of an arm64 image, made here: /opt/cfnet-<flavour> (a virtual environment's
# layout, aarch64 wheels) and /opt/cfnet-app (cfnet, pure Python, and the BPF files).
arm_python() {
  local flavour="$1" ctx="$2" py=python3 pip_ca=()
  [[ -x .venv/bin/python ]] && py=.venv/bin/python
  [[ -s "$CA_BUNDLE" ]] && pip_ca=(--cert "$CA_BUNDLE")
  local v="$ctx/opt/cfnet-$flavour"
  local sp="$v/lib/python3.11/site-packages"
  mkdir -p "$sp" "$v/bin" "$ctx/opt/cfnet-app"
  "$py" -c "import tomllib, sys; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p.get('optional-dependencies', {}).get(sys.argv[1], [])))" \
    "$flavour" > "$ctx/req.txt"
  # Pure-Python requirements published as sdists only (nkeys) have no wheel for --only-binary
  # to find: build theirs here (py3-none-any, the same on every architecture) and offer it.
  local pure="$ctx/pure-wheels" name
  rm -rf "$pure"; mkdir -p "$pure"
  for name in nkeys; do
    grep -q "^$name" "$ctx/req.txt" || continue
    "$py" -m pip wheel -q --disable-pip-version-check "${pip_ca[@]}" --no-deps -w "$pure" \
      "$(grep "^$name" "$ctx/req.txt")" >&2
  done
  if ls "$pure"/*.whl >/dev/null 2>&1 && ls "$pure"/*.whl | grep -qv -- '-py3-none-any.whl$'; then
    log "not pure Python: $(ls "$pure")"; exit 2
  fi
  "$py" -m pip install -q --disable-pip-version-check "${pip_ca[@]}" --no-compile \
    --target "$sp" --platform manylinux2014_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux_2_28_aarch64 --implementation cp --python-version 3.11 --abi cp311 \
    --only-binary=:all: --find-links "$pure" -r "$ctx/req.txt" >&2
  rm -rf "$pure"
  rm -rf "$sp"/bin "$sp"/pandas/tests "$sp"/numpy/*/tests "$sp"/numpy/tests "$sp"/kubernetes/aio \
         "$sp"/kubernetes/test "$sp"/kubernetes/e2e_test
  find "$v" -name __pycache__ -prune -exec rm -rf {} +
  printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n' > "$v/pyvenv.cfg"
  ln -sfn /usr/bin/python3 "$v/bin/python"; ln -sfn python "$v/bin/python3"
  echo /opt/cfnet-app > "$sp/cfnet-app.pth"
  "$py" -c "import tomllib; s = tomllib.load(open('pyproject.toml', 'rb'))['project']['scripts']; \
print(''.join(n + ' ' + t.replace(':', ' ') + '\n' for n, t in s.items()))" |
  while read -r name module func; do
    [[ -n "$name" ]] || continue
    printf '#!%s/bin/python\nimport sys\nfrom %s import %s\nsys.exit(%s())\n' \
      "/opt/cfnet-$flavour" "$module" "$func" "$func" > "$v/bin/$name"
    chmod 0755 "$v/bin/$name"
  done
  rm -rf "$ctx/wheel"
  "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$ctx/wheel" . >&2
  "$py" -m pip install -q --no-deps --no-compile --target "$ctx/opt/cfnet-app" "$ctx"/wheel/*.whl >&2
  rm -rf "$ctx/opt/cfnet-app/bin" "$ctx/opt/cfnet-app/edge_agent/bpf/obj" "$ctx/wheel" build
  mkdir -p "$ctx/opt/cfnet-app/bpf/obj"
  cp bpf/*.c bpf/*.h "$ctx/opt/cfnet-app/bpf/"
  cp bpf/obj/*.bpf.o "$ctx/opt/cfnet-app/bpf/obj/"
}

# What an image is made from (every file of the build context, .containerignore's list, by
# name and content): a rebuild is skipped while this is the image's srckey label.
src_key() {
  { cat pyproject.toml Containerfile tools/images.sh
    find edge_agent cloud_core bpf \( -name __pycache__ -prune \) -o -type f \
      ! -path bpf/obj/vmlinux.h ! -name '*.tmp*' -print | LC_ALL=C sort \
      | while read -r f; do printf '%s\n' "$f"; cat "$f"; done; } | sha256sum | cut -c1-16
}

build_arm64() {
  local flavour="$1" t0=$SECONDS ctx img="localhost/cfnet-$1-arm64:$TAG" key
  key="$(src_key)-$(arm_key)"
  if [[ $(podman image inspect --format '{{.Labels.srckey}}' "$img" 2>/dev/null) == "$key" ]]; then
    log "$img up to date (sources and arm64 base unchanged)"; echo "$img"; return 0
  fi
  local old new
  old=$(podman image inspect --format '{{.Id}}' "$img" 2>/dev/null || true)
  ctx=$(mktemp -d "${TMPDIR:-/tmp}/cfnet-arm64-$flavour.XXXXXX")
  trap 'rm -rf "$ctx"' RETURN
  log "arm64 $flavour: Python layer on this host (aarch64 wheels, no emulation)"
  arm_python "$flavour" "$ctx"
  cp Containerfile "$ctx/Containerfile"
  log "building $img (Containerfile target $flavour-prebuilt, --arch arm64, COPY only)"
  store build --quiet --layers --isolation chroot --arch arm64 --target "$flavour-prebuilt" \
    --label "srckey=$key" --build-arg "BASE=$ARM_BASE" -f "$ctx/Containerfile" -t "$img" \
    "$ctx" >/dev/null
  new=$(podman image inspect --format '{{.Id}}' "$img")
  if [[ -n "$old" && "$old" != "$new" ]]; then store rmi "$old" >/dev/null 2>&1 || true; fi
  log "cfnet-$flavour-arm64:$TAG built in $((SECONDS - t0)) s"
  echo "$img"
}

bpf_object() {
  local py=python3
  [[ -x .venv/bin/python ]] && py=.venv/bin/python
  "$py" -m tools.build_bpf >&2
}

build() {
  local target="$1" t0=$SECONDS secret=() old new key ctx=()
  key=$(src_key)
  if [[ "$target" == nats ]]; then
    # The binary, built (or found cached) by its own script; its version is in the key.
    local bin
    bin=$(bash tools/nats/build.sh >&2 && bash tools/nats/build.sh --print-path)
    [[ -x "$bin" ]] || { log "nats-server not built ($bin)"; exit 2; }
    ctx=(--build-context "natsbin=$(dirname "$bin")")
    key="$key-$(basename "$(dirname "$bin")")"
  fi
  # Up to date (built from these sources): nothing to do, not even the cached steps.
  if [[ $(podman image inspect --format '{{.Labels.srckey}}' "localhost/cfnet-$target:$TAG" \
          2>/dev/null) == "$key" ]]; then
    log "cfnet-$target:$TAG up to date (sources unchanged)"; echo "localhost/cfnet-$target:$TAG"
    return 0
  fi
  old=$(podman image inspect --format '{{.Id}}' "localhost/cfnet-$target:$TAG" 2>/dev/null || true)
  # This machine reaches PyPI through a TLS-re-signing proxy whose CA is in the host bundle.
  [[ -s "$CA_BUNDLE" ]] && secret=(--secret "id=pip-ca,src=$CA_BUNDLE")
  log "building cfnet-$target:$TAG (Containerfile target $target, BASE=$BASE)"
  # --layers: reuse unchanged steps across runs (podman's default is no layer cache for build)
  # --isolation chroot: RUN steps need no OCI runtime, so builds work where crun/runc cannot
  # start a container (this machine's cgroup v1/v2 hybrid; see run_flags).
  store build --quiet --layers --isolation chroot --target "$target" --build-arg "BASE=$BASE" \
    --label "srckey=$key" "${secret[@]}" "${ctx[@]}" -f Containerfile -t "localhost/cfnet-$target:$TAG" . >/dev/null
  new=$(podman image inspect --format '{{.Id}}' "localhost/cfnet-$target:$TAG")
  # The image this one replaces (untagged now) would keep its layers on disk forever.
  if [[ -n "$old" && "$old" != "$new" ]]; then store rmi "$old" >/dev/null 2>&1 || true; fi
  log "cfnet-$target:$TAG built in $((SECONDS - t0)) s"
  echo "localhost/cfnet-$target:$TAG"
}

sizes() {
  local t
  for t in "$@"; do
    local img="localhost/cfnet-$t:$TAG" raw gz
    raw=$(podman image inspect --format '{{.Size}}' "$img")
    gz=$(podman save --format oci-archive "$img" 2>/dev/null | wc -c)
    printf 'cfnet-%s:%s uncompressed %d MB, as saved (gzip layers) %d MB\n' \
      "$t" "$TAG" $((raw / 1000000)) $((gz / 1000000))
  done
}

# One build of each kind at a time across processes (the test workers, the suite's own
# build): a second waits, then finds the first's images built.
if [[ "${1:-build}" == build || "${1:-build}" == build-arm64 ]]; then
  mkdir -p "$CACHE"
  exec 7>"$CACHE/.${1:-build}.lock"
  flock 7
fi

case "${1:-build}" in
  base) ensure_base ;;
  build)
    ensure_base
    case "${2:-all}" in
      all) bpf_object; build core; build agent; build agent-bcc ;;
      agent|agent-bcc) bpf_object; build "$2" ;;
      core|mosquitto|nats) build "$2" ;;
      *) log "unknown target ${2}"; exit 2 ;;
    esac ;;
  sizes) sizes core agent agent-bcc ;;
  build-arm64)
    ensure_base_arm64
    bpf_object
    case "${2:-all}" in
      all) build_arm64 core; build_arm64 agent ;;
      core|agent) build_arm64 "$2" ;;
      *) log "unknown arm64 target ${2}"; exit 2 ;;
    esac ;;
  sizes-arm64) sizes core-arm64 agent-arm64 ;;
  *) sed -n '2,37p' "$0"; exit 2 ;;
esac
