#!/usr/bin/env bash
# Build the two images of the Dockerfile (targets `operator` and `trainer`), as shipped, with buildah from
# Debian's packages: no Docker daemon, no container registry. The base the Dockerfile names,
# python:3.11-slim, is made here from Debian 12 packages (mmdebstrap; Debian 12's Python is 3.11) and
# tagged under that name, so the same Dockerfile builds unchanged where a registry is reachable.
#
# Cached by a hash of what goes in (the Dockerfile, pyproject.toml, README.md, operator/, trainer_image/, this
# script): a second run with the same inputs prints the cached archives and builds nothing. The images are
# also written as OCI archives (what a node's containerd imports: `ctr images import`):
#   ~/.cache/ddpjob/images/<hash>/{operator,trainer}.tar
# Prints, at the end, each image's size, the uid it runs as and a smoke check (`--help`) of each.
# Measured here (2026-11-26, 2 cores): both built in 212 s from an empty cache; operator 422 MB, trainer
# 6.18 GB (torch's CUDA wheels from PyPI); the base 248 MB.
#
# Needs root (buildah's storage), Debian's buildah, podman and mmdebstrap (apt-get install buildah podman
# mmdebstrap uidmap), and PyPI for the images' pip installs (torch, in the trainer: a few GB).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(python3 -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
CACHE=${DDPJOB_IMAGE_CACHE:-$HOME/.cache/ddpjob/images}
HASH=$( (cat Dockerfile pyproject.toml README.md "$0"; git ls-files -s operator trainer_image 2>/dev/null \
  || find operator trainer_image -type f -name '*.py' -exec sha256sum {} +) | sha256sum | cut -c1-16)
OUT=$CACHE/$HASH
BASE=docker.io/library/python:3.11-slim
HOST_CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
say() { echo "images: $*" >&2; }

for tool in buildah podman mmdebstrap; do
  command -v "$tool" >/dev/null || { say "$tool is missing: apt-get install buildah podman mmdebstrap uidmap"; exit 1; }
done

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

# the same checks on a cached build: size, the user, --help. They run in the image with buildah's chroot
# isolation, not a container runtime: on this machine crun refuses the container's rlimits
# (RLIMIT_NOFILE/NPROC: Operation not permitted) and hybrid cgroups; a kubelet's containerd is issue 32's
# next step.
for target in operator trainer; do
  image=localhost/ddpjob/$target:$VERSION
  if ! buildah inspect --type image "$image" >/dev/null 2>&1; then
    buildah pull --quiet "oci-archive:$OUT/$target.tar" >/dev/null
    buildah tag "ddpjob/$target:$VERSION" "$image"
  fi
  size=$(podman image inspect --format '{{.Size}}' "$image")
  ctr=$(buildah from --quiet "$image")
  user=$(buildah run --isolation chroot "$ctr" -- id -u)
  case $target in
    operator) help=$(buildah run --isolation chroot "$ctr" -- ddpjob --help | head -1) ;;
    trainer) help=$(buildah run --isolation chroot "$ctr" -- python -m ddp_trainer --help | head -1) ;;
  esac
  buildah rm "$ctr" >/dev/null
  echo "$target $image $(( size / 1000000 )) MB, runs as uid $user, --help: ${help:0:40}..., archive $OUT/$target.tar"
done
