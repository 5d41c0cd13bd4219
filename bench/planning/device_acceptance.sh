#!/usr/bin/env bash
# The planner's acceptance (acceptance.sh) on the GPU machine's CPUs, a host that holds its speed
# better than the 2-core VM: every mix of MIXES runs at once, each in its own lanes of two
# physical cores (one hardware thread of each), and each lane is a 2-core host of its own
# (acceptance.sh, "Lanes"). The device tool moves at most 64 MiB, so the build and the model travel
# packed, in the carry, with models/ and bench/results/ out of the index for the call:
#   gpu-pack/slim.tar.xz   (../shared/tools/gpu-bundle DIR/gpu-out build/tandem, stripped, packed)
#   gpu-pack/model.tar.xz  (tar -cJf gpu-pack/model.tar.xz models/target)
# Env: OUT (required), MIXES ("mixed short_in"; as many run at once as there are 3 lanes for),
# LANES_PER_MIX (as many as the cores allow, at most 6), and acceptance.sh's RUN_S, MIN_PROMPTS, MAX_PROMPTS, PROFILE_REPEATS.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?set OUT}
work=${WORK:-/tmp/tandem-cpu}
mkdir -p "$work" "$out"
tar -xJf gpu-pack/slim.tar.xz -C "$work"
[[ -f models/target/config.json ]] || tar -xJf gpu-pack/model.tar.xz
export LD_LIBRARY_PATH=$work/gpu-out/lib:/usr/local/cuda/lib64
export UCX_MODULE_DIR=$work/gpu-out/ucx
lscpu >"$out/lscpu.txt"
lscpu -e >"$out/lscpu-e.txt"
read -r -a mixes <<<"${MIXES:-mixed short_in}"
# One line of lanes per mix: pairs of physical cores, the first hardware thread of each.
mapfile -t mix_lanes < <(python3 - "${#mixes[@]}" "${LANES_PER_MIX:-6}" <<'PY'
import subprocess, sys
n_mixes, most = int(sys.argv[1]), int(sys.argv[2])
first = {}
for line in subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True,
                           check=True).stdout.splitlines():
    if line.startswith("#"):
        continue
    cpu, core, socket = (int(x) for x in line.split(","))
    first.setdefault((socket, core), cpu)
cpus = sorted(first.values())
lanes = [f"{cpus[2 * i]},{cpus[2 * i + 1]}" for i in range(len(cpus) // 2)]
# At least 3 lanes a mix (the three layouts' points of one bracket at once): fewer mixes at a time
# where the cores are too few, the rest are left out (named on stderr).
runs = min(n_mixes, len(lanes) // 3)
if runs < 1:
    sys.exit(f"{len(cpus)} physical cores: too few for 3 lanes of 2")
if runs < n_mixes:
    print(f"{len(cpus)} physical cores: only the first {runs} mix(es) run", file=sys.stderr)
per = min(most, len(lanes) // runs)
for m in range(runs):
    print(" ".join(lanes[m * per:(m + 1) * per]))
PY
)
pids=()
for j in "${!mix_lanes[@]}"; do
  echo "[device-acceptance] ${mixes[$j]}: lanes ${mix_lanes[$j]}" | tee -a "$out/lanes.txt"
  OUT=$out/${mixes[$j]} LANES=${mix_lanes[$j]} PORT_BASE=$((18431 + 200 * j)) \
    MIXES=${mixes[$j]} TANDEM=$work/gpu-out/bin/tandem \
    bash bench/planning/acceptance.sh >"$out/${mixes[$j]}.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$out"/*/summary.txt 2>/dev/null || true
exit $rc
