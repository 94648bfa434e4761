#!/usr/bin/env bash
# Builds the control-plane binaries from the Go module proxy, once per machine, and prints the directory
# that holds them (`--check`: only if they are built already; exit 1 otherwise). The directory is keyed by the pinned versions and a hash of versions.env and the
# main.go files, so a cached build is found in milliseconds and a changed pin or plugin list builds anew.
# (go.mod/go.sum follow from those pins; `-mod=mod` keeps them complete.) The two Go modules build
# separately: a build that stopped half-way resumes with what is missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/versions.env"
source "$here/../gobuild.sh"

key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_coredns-${COREDNS_VERSION}_$(
  cd "$here" && { echo versions.env; find go -type f -name '*.go'; } | LC_ALL=C sort \
    | xargs sha256sum | sha256sum | cut -c1-12)"
cache="${DDPJOB_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddpjob/cluster}/$key"
bin="$cache/bin"
k8s_bins=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet pause)

missing() { for b in "$@"; do [[ -x "$bin/$b" ]] || return 0; done; return 1; }
if ! missing "${k8s_bins[@]}" coredns; then echo "$bin"; exit 0; fi
if [[ "${1:-}" == "--check" ]]; then exit 1; fi  # --check: print the directory if built, else fail

# One build at a time (two pytest workers, or a developer's `make cluster-up` beside `make test`): a second
# caller waits for the first, says so, and then finds the binaries built.
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
if ! flock -n 9; then
  echo "waiting for another build of the test cluster to finish (lock $cache.lock)" >&2
  flock 9
fi
if ! missing "${k8s_bins[@]}" coredns; then echo "$bin"; exit 0; fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
# sum.golang.org is not reachable from these machines; go.sum (committed) still pins every hash.
export GOSUMDB="${GOSUMDB:-off}"
mkdir -p "$bin" "$cache/tmp"
ver="k8s.io/component-base/version"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w -X $ver.gitVersion=$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor"
k8s_ldflags+=" -X $ver.gitTreeState=clean -X $ver.buildDate=1970-01-01T00:00:00Z"
k8s_ldflags+=" -X $ver.gitCommit=ddpjob-module-build"

# build NAME DIR LDFLAGS ESTIMATE BINARY...: go build in DIR, then move the binaries into place.
build() {
  local name="$1" dir="$2" ldflags="$3" estimate="$4"; shift 4
  local tmp start=$SECONDS
  tmp="$(mktemp -d "$cache/tmp/$name.XXXX")"
  quiet_build "$cache/build-$name.log" "$name ($*)" "none cached for this pin in $bin" "$estimate" \
    bash -c 'cd "$1" && "$2" build -trimpath -ldflags="$3" -o "$4/" ./...' _ "$here/go/$dir" "$GO" "$ldflags" "$tmp"
  for b in "$@"; do mv -f "$tmp/$b" "$bin/$b"; done
  rm -rf "$tmp"
  echo "$name built in $((SECONDS - start)) s" >> "$cache/build-times"
}

if missing "${k8s_bins[@]}"; then build kubernetes k8s "$k8s_ldflags" "21 min (5 with Go's caches warm)" "${k8s_bins[@]}"; fi
if missing coredns; then build coredns coredns "-s -w" "4.5 min" coredns; fi
echo "$bin"
