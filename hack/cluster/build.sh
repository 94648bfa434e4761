#!/usr/bin/env bash
# Builds the control-plane binaries from the Go module proxy, once per machine.
# Prints the directory that holds them. The directory is keyed by the pinned versions and a hash of
# versions.env and the main.go files, so a cached build is reused in milliseconds and a changed pin or
# plugin list builds anew. (go.mod/go.sum follow from those pins; `-mod=mod` keeps them complete.)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/versions.env"

key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_coredns-${COREDNS_VERSION}_$(
  cd "$here" && { echo versions.env; find go -type f -name '*.go'; } | LC_ALL=C sort \
    | xargs sha256sum | sha256sum | cut -c1-12)"
cache="${DDPJOB_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddpjob/cluster}/$key"
bin="$cache/bin"
want=(etcd kube-apiserver kube-controller-manager kube-scheduler coredns)

have_all() { for b in "${want[@]}"; do [[ -x "$bin/$b" ]] || return 1; done; }
if have_all; then echo "$bin"; exit 0; fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
# sum.golang.org is not reachable from these machines; go.sum (committed) still pins every hash.
export GOSUMDB="${GOSUMDB:-off}"
mkdir -p "$cache/tmp"
tmpbin="$(mktemp -d "$cache/tmp/bin.XXXX")"
ver="k8s.io/component-base/version"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w -X $ver.gitVersion=$K8S_VERSION -X $ver.gitMajor=1 -X $ver.gitMinor=$minor"
k8s_ldflags+=" -X $ver.gitTreeState=clean -X $ver.buildDate=1970-01-01T00:00:00Z"
k8s_ldflags+=" -X $ver.gitCommit=ddpjob-module-build"

start=$SECONDS
echo "building control plane into $bin (first build on this machine; takes a while)" >&2
(cd "$here/go/k8s" && "$GO" build -trimpath -ldflags="$k8s_ldflags" -o "$tmpbin/" ./cmd/...) >&2
(cd "$here/go/coredns" && "$GO" build -trimpath -ldflags="-s -w" -o "$tmpbin/coredns" .) >&2
mkdir -p "$bin"
for b in "${want[@]}"; do mv -f "$tmpbin/$b" "$bin/$b"; done
rmdir "$tmpbin"
echo "control plane built in $((SECONDS - start)) s" >&2
echo "$((SECONDS - start))" > "$cache/build-seconds"
echo "$bin"
