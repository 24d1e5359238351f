#!/usr/bin/env bash
# Builds the operator image and the CPU trainer image with podman (daemonless: buildah underneath, no
# registry reached). Both Dockerfiles take their base as a build argument whose default is what users pull
# (python:3.12-slim-bookworm, NGC PyTorch); no image registry is reachable here, so the base is made locally:
#   1. debootstrap Debian bookworm (minbase + the shared libraries CPython's modules link) from Debian's
#      mirror: the OS of python:3.12-slim-bookworm.               -> $CACHE/images/debian-bookworm.tar
#   2. Debian has no Python 3.12 (bookworm ships 3.11, trixie 3.13), so the machine's pyenv CPython 3.12
#      (the interpreter of the Makefile's venv) goes to /usr/local, the layout of python:*-slim images.
#                                                                   -> localhost/rtj-python:3.12-bookworm
#   3. podman build of Dockerfile and trainer-image/Dockerfile (WITH_EFA=0: the CPU variant).
# RUN steps use chroot isolation: this host mounts cgroup v1 controllers plus a cgroup2 hierarchy holding
# hugetlb ("hybrid"), which crun refuses; a build needs no cgroups. `podman run --runtime runc` runs them.
# Each step is skipped while its inputs are unchanged (image label rtj.inputs); podman's layer cache does
# the rest. Images: rtj-operator:local, rtj-trainer:cpu-local (localhost/ in podman's store).
# Usage: hack/build-images.sh [--force-base]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RTJ_CACHE:-$HOME/.cache/rtj}"
IMAGES="$CACHE/images"
LOGS="$CACHE/build-logs"
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# What CPython 3.12's extension modules link against (ldd of lib-dynload), plus CA certificates for pip.
DEBIAN_PACKAGES=ca-certificates,libssl3,libffi8,libsqlite3-0,libuuid1,libnsl2,libtirpc3,libbz2-1.0,liblzma5,libncursesw6,libreadline8,zlib1g,libexpat1
BASE_IMAGE=localhost/rtj-python:3.12-bookworm
BASE_REVISION=2 # bump when build_python_base changes what goes into the base
OPERATOR_IMAGE="${OPERATOR_IMAGE:-localhost/rtj-operator:local}"
TRAINER_IMAGE="${TRAINER_IMAGE:-localhost/rtj-trainer:cpu-local}"
FORCE_BASE=0
[[ "${1:-}" == "--force-base" ]] && FORCE_BASE=1
mkdir -p "$IMAGES" "$LOGS"

log() { echo "[build-images $(date +%H:%M:%S)] $*" >&2; }

# CPython 3.12 as the Makefile finds it (PYTHON312 overrides).
python312() {
  local p
  for p in ${PYTHON312:-} python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if [[ -n "$p" ]] && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$p"
      return
    fi
  done
  echo "Python 3.12 not found (pyenv install 3.12, or set PYTHON312)" >&2
  return 1
}

image_inputs() { podman image inspect --format '{{ index .Labels "rtj.inputs" }}' "$1" 2>/dev/null || true; }

build_rootfs() {
  local tar="$IMAGES/debian-$DEBIAN_SUITE.tar" stamp="$IMAGES/debian-$DEBIAN_SUITE.packages"
  if ((!FORCE_BASE)) && [[ -s "$tar" && "$(cat "$stamp" 2>/dev/null)" == "$DEBIAN_PACKAGES" ]]; then
    log "debian $DEBIAN_SUITE rootfs: cached"
    return
  fi
  log "debian $DEBIAN_SUITE rootfs: debootstrap from $DEBIAN_MIRROR"
  local dir="$IMAGES/.rootfs.tmp"
  rm -rf "$dir"
  debootstrap --variant=minbase --include="$DEBIAN_PACKAGES" "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" \
    >"$LOGS/debootstrap.log" 2>&1 || { tail -n 30 "$LOGS/debootstrap.log" >&2; return 1; }
  # As in Debian's own container images: no package lists or caches in the image.
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb
  tar --numeric-owner -C "$dir" -cf "$tar.tmp" .
  mv "$tar.tmp" "$tar"
  echo "$DEBIAN_PACKAGES" >"$stamp"
  rm -rf "$dir"
  log "debian $DEBIAN_SUITE rootfs: done"
}

build_python_base() {
  local py prefix version inputs
  py="$(python312)"
  prefix="$("$py" -c 'import sys; print(sys.base_prefix)')"
  version="$("$py" -c 'import platform; print(platform.python_version())')"
  inputs="r$BASE_REVISION $DEBIAN_SUITE $DEBIAN_PACKAGES $(sha256sum "$IMAGES/debian-$DEBIAN_SUITE.tar" | cut -c1-16) python-$version"
  if ((!FORCE_BASE)) && [[ "$(image_inputs "$BASE_IMAGE")" == "$inputs" ]]; then
    log "$BASE_IMAGE: cached (CPython $version)"
    return
  fi
  log "$BASE_IMAGE: bookworm + CPython $version from $prefix"
  local ctr mnt
  ctr="$(buildah from scratch)"
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' RETURN
  buildah add --quiet "$ctr" "$IMAGES/debian-$DEBIAN_SUITE.tar" / >/dev/null
  mnt="$(buildah mount "$ctr")"
  # The interpreter, its standard library and pip; not the test suite, tkinter/idle, caches, nor anything
  # installed into this machine's site-packages.
  tar -C "$prefix" --exclude='lib/python3.12/test' --exclude='lib/python3.12/idlelib' \
    --exclude='lib/python3.12/tkinter' --exclude='lib/python3.12/turtledemo' --exclude='__pycache__' \
    --exclude='lib/python3.12/site-packages/*' --exclude='*.a' --exclude='lib/python3.12/lib-dynload/_tkinter*' \
    --exclude='bin/idle*' --exclude='bin/pip*' --exclude='bin/2to3*' --exclude='bin/pydoc*' \
    -cf - bin include lib share 2>/dev/null | tar -C "$mnt/usr/local" --no-same-owner -xf -
  buildah umount "$ctr" >/dev/null
  # libpython3.12.so is found through ld.so.cache (the pyenv RUNPATH does not exist in the image).
  buildah run --isolation chroot "$ctr" -- sh -c 'ldconfig && cd /usr/local/bin && ln -sf python3.12 python3 && ln -sf python3 python \
    && python -m ensurepip --default-pip >/dev/null && python -m pip --version && python -c "import ssl, sqlite3, ctypes, lzma, bz2"'
  buildah config --env LANG=C.UTF-8 --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 --label "rtj.inputs=$inputs" \
    --label org.opencontainers.image.description="Debian $DEBIAN_SUITE + CPython $version in /usr/local (local stand-in for python:3.12-slim-bookworm)" \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
  trap - RETURN
  log "$BASE_IMAGE: done"
}

build_image() { # NAME LOGNAME podman-build-args...
  local name="$1" logname="$2" start=$SECONDS
  shift 2
  log "$name: podman build $*"
  # Behind a TLS-intercepting proxy pip needs the host's CA bundle: mounted for the RUN steps only.
  local ca=()
  if [[ -n "${PIP_CERT:-}" && -r "$PIP_CERT" ]]; then
    ca=(--volume "$PIP_CERT:/run/rtj-build-ca.crt:ro" --build-arg PIP_CERT=/run/rtj-build-ca.crt)
  fi
  if ! podman build --isolation chroot --layers --pull=never "${ca[@]}" -t "$name" "$@" "$ROOT" >"$LOGS/$logname.log" 2>&1; then
    log "FAILED: $name (log: $LOGS/$logname.log)"
    tail -n 40 "$LOGS/$logname.log" >&2
    return 1
  fi
  log "$name: built ($((SECONDS - start)) s)"
}

main() {
  local start=$SECONDS
  command -v podman >/dev/null && command -v buildah >/dev/null && command -v debootstrap >/dev/null || {
    echo "needs podman, buildah and debootstrap: apt-get install -y podman buildah crun debootstrap" >&2
    exit 1
  }
  build_rootfs
  build_python_base
  build_image "$OPERATOR_IMAGE" image-operator --build-arg "PYTHON_IMAGE=$BASE_IMAGE" -f "$ROOT/Dockerfile"
  build_image "$TRAINER_IMAGE" image-trainer --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg WITH_EFA=0 \
    -f "$ROOT/trainer-image/Dockerfile"
  log "images ready ($((SECONDS - start)) s): $OPERATOR_IMAGE $TRAINER_IMAGE"
}

main "$@"
