#!/usr/bin/env bash
# Helpers for benchmark scripts that start `tandem serve` (sourced, not run).
#   http_get URL                         the body of a 200 answer (curl, or python3 where the
#                                        GPU host has no curl)
#   wait_healthy PORT PID LOG SECONDS    0 once http://127.0.0.1:PORT/health answers; otherwise
#                                        says which log to read, interrupts PID and returns 1

http_get() {
  if command -v curl >/dev/null; then
    curl -fs "$1"
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2>/dev/null
  fi
}

wait_healthy() {
  local port=$1 pid=$2 log=$3 deadline=$((SECONDS + $4))
  until http_get "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if ((SECONDS > deadline)) || ! kill -0 "$pid" 2>/dev/null; then
      echo "serve did not come up: $log" >&2
      kill -INT "$pid" 2>/dev/null || true
      return 1
    fi
    sleep 1
  done
}
