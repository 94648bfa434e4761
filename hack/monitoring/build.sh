#!/usr/bin/env bash
# Builds the monitoring stack from the Go module proxy, once per machine, and prints the directory that
# holds the binaries: prometheus and promtool (Prometheus 3), alertmanager, and the Prometheus Operator
# (operator, prometheus-config-reloader). `--check`: print it only if everything is built (exit 1 otherwise).
# The directory is keyed by versions.env and the go.mod files, so a changed pin builds anew. Each Go module
# (go/prometheus, go/alertmanager, go/operator) builds on its own: the three pin different versions of
# the same libraries, and a build that stopped half-way resumes with what is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/versions.env"

key="prometheus-${PROMETHEUS_RELEASE}_alertmanager-${ALERTMANAGER_VERSION}_operator-${PROMETHEUS_OPERATOR_VERSION}_$(
  cd "$here" && { echo versions.env; find go -type f -name 'go.mod'; } | LC_ALL=C sort \
    | xargs sha256sum | sha256sum | cut -c1-12)"
cache="${DDPJOB_MONITORING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddpjob/monitoring}/$key"
bin="$cache/bin"
all=(prometheus promtool alertmanager operator prometheus-config-reloader)

missing() { for b in "$@"; do [[ -x "$bin/$b" ]] || return 0; done; return 1; }
if ! missing "${all[@]}"; then echo "$bin"; exit 0; fi
if [[ "${1:-}" == "--check" ]]; then exit 1; fi

mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
if ! flock -n 9; then
  echo "waiting for another build of the monitoring stack to finish (lock $cache.lock)" >&2
  flock 9
fi
if ! missing "${all[@]}"; then echo "$bin"; exit 0; fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
export GOSUMDB="${GOSUMDB:-off}"  # sum.golang.org is not reachable here; go.sum (committed) pins every hash
mkdir -p "$bin" "$cache/tmp"
stamp() {  # -X flags for github.com/prometheus/common/version, so `--version` names the release
  local v="github.com/prometheus/common/version"
  echo "-s -w -X $v.Version=$1 -X $v.Revision=ddpjob-module-build -X $v.Branch=HEAD -X $v.BuildUser=ddpjob"
}

# build NAME MODULE_DIR LDFLAGS TAGS ESTIMATE PACKAGE...: go build the main packages in that module, then move them
# into place.
build() {
  local name="$1" dir="$2" ldflags="$3" tags="$4" estimate="$5"; shift 5
  local tmp start=$SECONDS
  tmp="$(mktemp -d "$cache/tmp/$name.XXXX")"
  quiet_build "$cache/build-$name.log" "$name" "none cached for this pin in $bin" "$estimate" \
    bash -c 'd="$1" t="$2" tags="$3" l="$4" go="$5"; shift 5; cd "$d" && "$go" build -trimpath -tags="$tags" -ldflags="$l" -o "$t/" "$@"' \
    _ "$dir" "$tmp" "$tags" "$ldflags" "$GO" "$@"
  mv -f "$tmp"/* "$bin/"
  rm -rf "$tmp"
  echo "$name built in $((SECONDS - start)) s" >> "$cache/build-times"
}

operator="github.com/prometheus-operator/prometheus-operator"
if missing operator prometheus-config-reloader; then
  build prometheus-operator "$here/go/operator" "$(stamp "${PROMETHEUS_OPERATOR_VERSION#v}")" "" "8 min" \
    "$operator/cmd/operator" "$operator/cmd/prometheus-config-reloader"
fi
if missing alertmanager; then
  # Alertmanager's module embeds its web UI from ui/app/dist, which its release process builds with npm and
  # the module zip lacks (`pattern app/dist: no matching files found`). Build from a copy of the module
  # with a one-page stand-in there (the API, /api/v2, is all the tests and Prometheus use), put in place
  # by a `replace` in a copy of go/alertmanager.
  am="github.com/prometheus/alertmanager"
  work="$(mktemp -d "$cache/tmp/alertmanager-src.XXXX")"
  src="$(cd "$here/go/alertmanager" && "$GO" mod download -json "$am@$ALERTMANAGER_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  cp -r "$src" "$work/alertmanager" && chmod -R u+w "$work/alertmanager"
  mkdir -p "$work/alertmanager/ui/app/dist"
  echo '<!doctype html><title>Alertmanager</title><p>Built without its web UI; the API is at /api/v2.' \
    > "$work/alertmanager/ui/app/dist/index.html"
  cp "$here/go/alertmanager/go.mod" "$here/go/alertmanager/go.sum" "$work/"
  echo "replace $am => ./alertmanager" >> "$work/go.mod"
  build alertmanager "$work" "$(stamp "${ALERTMANAGER_VERSION#v}")" "" "5 min" "$am/cmd/alertmanager"
  rm -rf "$work"
fi
if missing prometheus promtool; then
  build prometheus "$here/go/prometheus" "$(stamp "$PROMETHEUS_RELEASE")" "$PROMETHEUS_BUILD_TAGS" "10 min" \
    github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
fi
echo "$bin"
