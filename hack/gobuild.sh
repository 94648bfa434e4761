# Sourced by the Go builds (hack/cluster/build.sh, hack/cluster/kueue.sh, hack/monitoring/build.sh,
# hack/s3/build.sh): one line per build on stderr (what, why, roughly how long, where the log is), the Go
# tool's own output (hundreds of "go: downloading" lines on a fresh machine) in that log, and its last
# lines on stderr only when the build fails.

# quiet_build LOG WHAT WHY ESTIMATE CMD...: run CMD with its output appended to LOG.
quiet_build() {
  local log="$1" what="$2" why="$3" estimate="$4"; shift 4
  local start=$SECONDS
  mkdir -p "$(dirname "$log")"
  echo "building $what: $why; about $estimate on 2 cores (full log: $log)" >&2
  if ! "$@" >>"$log" 2>&1; then
    echo "building $what failed after $((SECONDS - start)) s; the last lines of $log:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
  echo "built $what in $((SECONDS - start)) s" >&2
}
