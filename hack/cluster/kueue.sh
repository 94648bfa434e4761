#!/usr/bin/env bash
# Builds Kueue's controller (`sigs.k8s.io/kueue/cmd/kueue`) from the Go module proxy, once per machine, and
# prints the directory that holds it: `<dir>/bin/kueue`, and `<dir>/config/` (the release's own CRDs and
# webhook manifests, copied from the module, which the test cluster installs: testcluster/kueue.py).
# `--check`: print the directory only if it is built already (exit 1 otherwise).
#
# Kueue's go.mod has no replace directives, so `go install module/cmd@version` builds the release exactly as
# its go.mod and go.sum pin it; GOSUMDB=off because sum.golang.org is not reachable here (go.sum still pins
# every hash). Cached by the version and a hash of this script, like hack/cluster/build.sh's binaries.
# Measured here (2 cores, 2026-11-27): 160 s with an empty module cache for Kueue's dependencies.
set -euo pipefail
KUEUE_VERSION=v0.17.0
MODULE=sigs.k8s.io/kueue
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
key="kueue-${KUEUE_VERSION}_$(sha256sum "$here/kueue.sh" | cut -c1-12)"
cache="${DDPJOB_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddpjob/cluster}/$key"

built() { [[ -x "$cache/bin/kueue" && -f "$cache/config/webhook/manifests.yaml" ]]; }
if built; then echo "$cache"; exit 0; fi
if [[ "${1:-}" == "--check" ]]; then exit 1; fi

mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
if ! flock -n 9; then
  echo "waiting for another build of Kueue to finish (lock $cache.lock)" >&2
  flock 9
fi
if built; then echo "$cache"; exit 0; fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0 GOSUMDB="${GOSUMDB:-off}"
start=$SECONDS
tmp="$(mktemp -d "$(dirname "$cache")/kueue-build.XXXX")"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"
ldflags="-s -w -X $MODULE/pkg/version.GitVersion=$KUEUE_VERSION -X $MODULE/pkg/version.GitCommit=module-build"
quiet_build "$(dirname "$cache")/kueue-build.log" "Kueue $KUEUE_VERSION ($MODULE/cmd/kueue)" \
  "not built on this machine yet (the cluster tier queues DDPJobs with it)" "3 min" \
  bash -c 'cd "$1" && GOBIN="$1/bin" "$2" install -trimpath -ldflags="$3" "$4"' _ \
  "$tmp" "$GO" "$ldflags" "$MODULE/cmd/kueue@$KUEUE_VERSION"
source_dir="$("$GO" mod download -json "$MODULE@$KUEUE_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')"
mkdir -p "$tmp/config"
cp -r "$source_dir/config/components/crd" "$source_dir/config/components/webhook" "$tmp/config/"
chmod -R u+w "$tmp/config"
rm -rf "$cache" && mkdir -p "$cache" && mv "$tmp/bin" "$tmp/config" "$cache/"
echo "Kueue built in $((SECONDS - start)) s" >> "$cache/build-times"
echo "$cache"
