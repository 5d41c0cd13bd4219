#!/usr/bin/env bash
# What service authentication costs the router's throughput: `tandem serve` (1 prefill + 1 decode
# worker, the bundled model, CPU) under `tandem bench` at 256 concurrent streaming requests, in
# three modes, interleaved round by round so drift hits all of them alike:
#   none   --insecure-services (the ceiling: no authentication at all)
#   token  the default: serve's fresh per-deployment token on every gRPC call
#   mtls   --tls-ca/--tls-cert/--tls-key: every hop over TLS with client certificates
# Usage: bench/auth/auth_overhead.sh [BUILD_DIR] [ROUNDS] [PROMPTS]
# Prints one line per run and a summary table (output tokens/s: mean of the rounds, and each
# mode's cost against none). Raw `tandem bench --json` files stay in $WORK (printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
rounds=${2:-3}
prompts=${3:-512}
tandem="$build/tandem"
[[ -x $tandem ]] || { echo "no $tandem: build first (./quickstart build)" >&2; exit 2; }
command -v openssl >/dev/null || { echo "the openssl CLI is needed for the mtls mode" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tandem-auth-bench-XXXXXX")
echo "raw results in $WORK" >&2

# One cluster CA and one service certificate valid for 127.0.0.1 (server and client use).
(
  cd "$WORK"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
    -subj /CN=bench-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout svc.key -out svc.csr -subj /CN=tandem 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > svc.ext
  openssl x509 -req -in svc.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out svc.pem -days 2 \
    -extfile svc.ext 2>/dev/null
  chmod 600 svc.key
)

mode_flags() {
  case $1 in
    none) echo "--insecure-services" ;;
    token) echo "" ;;
    mtls) echo "--tls-ca $WORK/ca.pem --tls-cert $WORK/svc.pem --tls-key $WORK/svc.key" ;;
  esac
}

run_one() {  # mode round -> prints output tok/s
  local mode=$1 round=$2 port=18400 log="$WORK/serve_$1_$2.log" up=0
  # shellcheck disable=SC2046
  "$tandem" serve --port $port --kv-cache-mib 512 --startup-timeout-s 120 $(mode_flags "$mode") \
    > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 240); do
    grep -q "is serving" "$log" && { up=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  if ((!up)); then
    echo "serve ($mode) did not come up; see $log" >&2
    kill $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    return 1
  fi
  "$tandem" bench --url "http://127.0.0.1:$port/v1" --max-concurrency 256 \
    --num-prompts "$prompts" --input-len 64 --output-len 32 --ignore-eos --warmup 32 \
    --no-progress --json "$WORK/bench_${mode}_${round}.json" > "$WORK/bench_${mode}_${round}.txt"
  kill -INT $pid
  wait $pid 2>/dev/null || true
  python3 - "$WORK/bench_${mode}_${round}.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d.get("summary", d)
ok, failed = s.get("completed", 0), s.get("failed", 0)
print(f'{s["output_throughput"]:.2f} {ok} {failed}')
PY
}

declare -A sum
for mode in none token mtls; do sum[$mode]=0; done
# One unmeasured run first (page cache, model load), then the rounds; the order rotates each
# round so no mode always runs first or last.
run_one token 0 > /dev/null
modes=(none token mtls)
for round in $(seq 1 "$rounds"); do
  shift_by=$(((round - 1) % 3))
  for i in 0 1 2; do
    mode=${modes[$(((i + shift_by) % 3))]}
    read -r tps ok failed < <(run_one "$mode" "$round")
    echo "round $round  $mode  $tps output tok/s  ($ok completed, $failed failed)"
    sum[$mode]=$(python3 -c "print(${sum[$mode]} + $tps)")
  done
done
echo
echo "| mode | output tok/s (mean of $rounds) | vs none |"
echo "|---|---|---|"
none=$(python3 -c "print(${sum[none]} / $rounds)")
for mode in none token mtls; do
  python3 -c "m = ${sum[$mode]} / $rounds; print(f'| $mode | {m:.1f} | {100 * (m / $none - 1):+.2f}% |')"
done
