#!/usr/bin/env bash
# Builds the MinIO server (a real S3-compatible server: signature v4, real credential checks and S3 error
# codes, multipart uploads) from the Go module proxy, once per machine, and prints the binary's path
# (`--check`: only if it is built already; exit 1 otherwise). The tests' S3 server (tests/helpers/s3server.py).
# MinIO tags no semantic versions, so the proxy serves it as a pseudo-version: pinned here. About 2.5 min
# on 2 cores with a warm Go build cache (the control plane's shares many modules), longer from cold.
set -euo pipefail
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"
cache="${DDPJOB_S3_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddpjob/s3}/minio-$MINIO_VERSION"
if [[ -x "$cache/minio" ]]; then echo "$cache/minio"; exit 0; fi
if [[ "${1:-}" == "--check" ]]; then exit 1; fi
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
export GOSUMDB="${GOSUMDB:-off}"  # sum.golang.org is not reachable from these machines
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.build.XXXX")"
start=$SECONDS
source "$(dirname "${BASH_SOURCE[0]}")/../gobuild.sh"
quiet_build "$cache/build.log" "MinIO $MINIO_VERSION (the object-storage tests' S3 server)" \
  "not built on this machine yet" "2.5 min" \
  env GOBIN="$tmp" "$GO" install -trimpath -ldflags="-s -w" "github.com/minio/minio@$MINIO_VERSION"
mv -f "$tmp/minio" "$cache/minio"
rm -rf "$tmp"
echo "$cache/minio"
