#!/usr/bin/env bash
# `make test`'s step before pytest: the images of the current inputs for the real-node tier
# (testcluster/tests/test_realnode.py, tests/e2e/test_real_nodes.py), built once per machine and input hash.
#
# Where this machine cannot build them, it says why and returns 0: those tests then skip, each saying why
# (testcluster/realfixture.py). The reasons are the machine's, never the project's: not root, no
# Debian packages to be had, too little disk. A build that starts and fails fails `make test`.
# Installs what the build and the real nodes need from Debian's packages when missing (root): buildah,
# podman, mmdebstrap, uidmap (the build), containerd, runc, containernetworking-plugins (the nodes).
# Before a new build, older archives are deleted; after it, the layers only the older images used.
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { echo "images for the real-node tests: $*" >&2; }
CACHE=${DDPJOB_IMAGE_CACHE:-$HOME/.cache/ddpjob/images}
# the build: the trainer's dependency layer (~6 GB, written then committed: ~12 GB at its peak) when
# pyproject.toml changed, else megabytes; the archives ~3.5 (measured); the nodes' imports (~6 GB each) are
# checked when they happen (testcluster/realfixture.py), and skip saying why if they would not fit.
# A build that met a full disk (stop 65's CI: 12 GB were asked, the layer's peak was more) fails make test.
NEED_GB=${DDPJOB_IMAGE_DISK_GB:-16}

if current=$(hack/images/build.sh --check 2>/dev/null); then
  say "cached: $current"
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  say "not built: needs root (buildah's storage, the nodes' containerd); the real-node tests will skip"
  exit 0
fi
packages=(buildah podman mmdebstrap uidmap containerd runc containernetworking-plugins)
missing=()
for p in "${packages[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  say "installing ${missing[*]} from Debian's packages"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >&2; then
    say "not built: apt-get could not install ${missing[*]}; the real-node tests will skip"
    exit 0
  fi
fi
mkdir -p "$CACHE"
# the archives of older inputs serve nothing once the inputs changed: they go before the build, not after
for old in "$CACHE"/*/; do
  [[ -d $old ]] && rm -rf "$old" && say "removed the older archives $old"
done
buildah rmi --prune >/dev/null 2>&1 || true  # layers no tagged image uses: an earlier build's, cut short
free_gb=$(( $(df --output=avail -k "$CACHE" | tail -1) / 1024 / 1024 ))
if (( free_gb < NEED_GB )); then
  say "not built: $free_gb GB free on $CACHE's disk, the build needs ~$NEED_GB GB; the real-node tests will skip"
  exit 0
fi
start=$SECONDS
current=$(hack/images/build.sh --no-smoke | tail -1)
buildah rmi --prune >/dev/null 2>&1 || true  # the previous build's layers, untagged by this one
say "built in $((SECONDS - start)) s: $current"
