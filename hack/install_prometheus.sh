#!/usr/bin/env bash
# Prometheus and promtool for the monitoring tests (tests/integration/monitoring): Debian's `prometheus` package
# (2.42 on bookworm). Installing it does not start a service; the tests run `prometheus` as a plain process
# on 127.0.0.1. Does nothing when promtool and prometheus are already on PATH.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_prometheus: no apt-get here; install Prometheus 2.x (prometheus and promtool) on PATH" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q prometheus >/dev/null || { $SUDO apt-get update -q && $SUDO apt-get install -y -q prometheus; }
promtool --version | head -1
