#!/usr/bin/env bash
# Build the two images of the Dockerfile (targets `operator` and `trainer`), as shipped, with buildah from
# Debian's packages: no Docker daemon, no container registry. The base the Dockerfile names,
# python:3.11-slim, is made here from Debian 12 packages (mmdebstrap; Debian 12's Python is 3.11) and
# tagged under that name, so the same Dockerfile builds unchanged where a registry is reachable.
#
# Cached by a hash of what goes in (the Dockerfile, pyproject.toml, operator/, trainer_image/, the examples'
# scripts, this script, as they are in the working tree): a second run with the same inputs prints the
# cached archives and builds nothing. README.md goes in too, but
# only as the wheel's long description: it is left out of the hash, or every edit of the docs would rebuild
# the 3.3 GB trainer (and make test re-import it into both real nodes). The images are
# also written as OCI archives (what a node's containerd imports: `ctr images import`):
#   ~/.cache/ddpjob/images/<hash>/{operator,trainer}.tar
# Prints, at the end, each image's size, the uid it runs as and a smoke check (`--help`) of each.
# Measured here (2026-11-26, 2 cores): both built in 212 s from an empty cache (61 s with buildah's layer
# cache); unpacked operator 422 MB, trainer 6.18 GB (torch's CUDA wheels from PyPI), base 248 MB; as OCI
# archives 119 MB and 3.3 GB; the smoke checks in containerd + runc 76 s (the trainer's import).
#
# Needs root (buildah's storage), Debian's buildah, podman and mmdebstrap (apt-get install buildah podman
# mmdebstrap uidmap), and PyPI for the images' pip installs (torch, in the trainer: a few GB).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(python3 -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
CACHE=${DDPJOB_IMAGE_CACHE:-$HOME/.cache/ddpjob/images}
# the files as they are in the working tree (an edit not yet staged is what the build copies), tracked or
# not, but for what git ignores (caches, build output)
inputs() {
  { git ls-files --cached --others --exclude-standard operator trainer_image 'examples/*.py' 2>/dev/null \
    || find operator trainer_image examples -type f -not -name '*.pyc'; } | sort -u | while read -r f; do
    [[ -f $f ]] && sha256sum "$f"; done
}
HASH=$( (cat Dockerfile pyproject.toml "$0"; inputs) | sha256sum | cut -c1-16)
OUT=$CACHE/$HASH
BASE=docker.io/library/python:3.11-slim
HOST_CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
say() { echo "images: $*" >&2; }

for tool in buildah podman mmdebstrap; do
  command -v "$tool" >/dev/null || { say "$tool is missing: apt-get install buildah podman mmdebstrap uidmap"; exit 1; }
done

# --check: print the folder of the archives for the current inputs if they are built, else fail; builds
# nothing (the test cluster's real nodes find the archives to import this way)
if [[ ${1:-} == --check ]]; then
  [[ -f $OUT/operator.tar && -f $OUT/trainer.tar ]] || { say "not built for inputs $HASH: run make images"; exit 1; }
  echo "$OUT"; exit 0
fi

if [[ -f $OUT/operator.tar && -f $OUT/trainer.tar ]]; then
  say "cached: $OUT (inputs $HASH)"
else
  started=$(date +%s)
  if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
    say "making $BASE from Debian 12 packages (mmdebstrap; Python 3.11)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # what python:3.11-slim offers: python and pip on PATH that install into the system (no PEP 668
    # refusal: this image is the environment), useradd, CA certificates
    mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,passwd \
      --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
      --customize-hook='ln -sf /usr/bin/python3 "$1"/usr/local/bin/python' \
      --customize-hook='ln -sf /usr/bin/pip3 "$1"/usr/local/bin/pip' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
      bookworm "$work/rootfs.tar"
    ctr=$(buildah from scratch)
    buildah add "$ctr" "$work/rootfs.tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
      --cmd python3 --label org.opencontainers.image.description="python:3.11-slim stand-in, Debian 12" "$ctr"
    buildah commit --quiet "$ctr" "$BASE" >/dev/null
    buildah rm "$ctr" >/dev/null
    rm -rf "$work"
    trap - EXIT
  fi
  mkdir -p "$OUT"
  for target in operator trainer; do
    say "building ddpjob/$target:$VERSION (Dockerfile target $target)"
    # chroot isolation: RUN steps need no OCI runtime or cgroups (this machine has hybrid v1/v2 cgroups,
    # which crun refuses); the steps only run pip
    # this machine's CA bundle is bind-mounted over the image's during RUN steps (not committed): pip then
    # trusts what this machine trusts (an egress proxy's CA, say)
    buildah bud --quiet --layers --isolation chroot --network host --target "$target" --label "io.ddpjob.inputs=$HASH" \
      --volume "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro" \
      -t "localhost/ddpjob/$target:$VERSION" -f Dockerfile . >/dev/null
    rm -f "$OUT/$target.tar.part"
    buildah push --quiet "localhost/ddpjob/$target:$VERSION" "oci-archive:$OUT/$target.tar.part:ddpjob/$target:$VERSION"
    mv "$OUT/$target.tar.part" "$OUT/$target.tar"
  done
  say "built in $(( $(date +%s) - started )) s"
fi

# --no-smoke: build (or find) the archives only; the real-node tests (make test) check them in a kubelet
if [[ ${1:-} == --no-smoke ]]; then
  echo "$OUT"; exit 0
fi

# The same checks on a cached build: size, the user, the PID namespace, --help. Where Debian's containerd
# and runc are installed (apt-get install containerd runc), in real containers: a private containerd (its
# own root, state and socket under $CACHE/containerd) imports the OCI archives as a node would and runs
# them with runc. Otherwise in the image with buildah's chroot isolation (crun, podman's runtime, refuses
# the container's rlimits here: RLIMIT_NOFILE/NPROC, Operation not permitted).
check() {  # target, then the command of a check; prints its output
  local target=$1; shift
  if [[ -n ${CTR:-} ]]; then
    "${CTR[@]}" run --rm "ddpjob/$target:$VERSION" "smoke-$target-$RANDOM" "$@"
  else
    local ctr; ctr=$(buildah from --quiet "localhost/ddpjob/$target:$VERSION")
    buildah run --isolation chroot "$ctr" -- "$@"
    buildah rm "$ctr" >/dev/null
  fi
}
if command -v containerd >/dev/null && command -v runc >/dev/null; then
  run=/run/ddpjob-images-containerd
  mkdir -p "$run" "$CACHE/containerd"
  containerd --root "$CACHE/containerd" --state "$run/state" --address "$run/containerd.sock" \
    >"$run/containerd.log" 2>&1 &
  daemon=$!
  # the private containerd goes after the checks: its unpacked trainer alone is ~9 GB
  trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$CACHE/containerd"' EXIT
  CTR=(ctr --address "$run/containerd.sock" -n ddpjob)
  for _ in $(seq 50); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.2; done
  for target in operator trainer; do
    "${CTR[@]}" images import --base-name "ddpjob/$target" "$OUT/$target.tar" >/dev/null
  done
  where="containerd $(containerd --version | awk '{print $3}') + runc"
else
  for target in operator trainer; do
    image=localhost/ddpjob/$target:$VERSION
    if ! buildah inspect --type image "$image" >/dev/null 2>&1; then
      buildah pull --quiet "oci-archive:$OUT/$target.tar" >/dev/null
      buildah tag "ddpjob/$target:$VERSION" "$image"
    fi
  done
  where="buildah run, chroot isolation"
fi
say "smoke checks in $where"
for target in operator trainer; do
  size=$(stat -c %s "$OUT/$target.tar")
  seen=$(check "$target" sh -c 'echo "uid $(id -u) pid $$"')
  case $target in
    operator) help=$(check "$target" ddpjob --help | head -1) ;;
    trainer) help=$(check "$target" python -m ddp_trainer --help | head -1) ;;
  esac
  echo "$target ddpjob/$target:$VERSION archive $(( size / 1000000 )) MB, $seen, --help: ${help:0:40}..., $OUT/$target.tar"
done
