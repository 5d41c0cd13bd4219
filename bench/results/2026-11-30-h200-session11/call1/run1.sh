#!/usr/bin/env bash
# Session 11, call 1 (bundle of 4cb77e3): where decode batch 64 at 1K spends its step.
#  a) engine_bench b64@1K graph time on this machine start (no profiler).
#  b) Nsight Compute, every kernel of ~2 steps, duration only, no cache flush: the kernels' own
#     time summed per step against the graph time (the gap = launch / fill / drain bubbles).
#  c) full memory metrics on two layers' kernels, cuBLASLt path (default) and the skinny GEMM
#     forced to 64 rows: DRAM / L2 throughput, L2->SM sectors, fabric sectors.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
T0=$(date +%s)
dc_wait_synth
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
ARGS="--model /tmp/tandem_m8b --batches 64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab"
timeout 90 "$B/engine_bench" $ARGS --iters 50 > "$R/bench_b64.txt" 2>&1
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
timeout 150 $NCU --cache-control none --clock-control none --launch-skip 1500 --launch-count 600 \
  --metrics gpu__time_duration.sum --csv --print-units base \
  "$B/engine_bench" $ARGS --iters 10 > "$R/ncu_durations.csv" 2>&1
echo "durations rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_ltcfabric.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.avg.per_cycle_active,l1tex__throughput.avg.pct_of_peak_sustained_elapsed
for v in cublaslt skinny64; do
  extra=""
  [ $v = skinny64 ] && extra="TANDEM_SKINNY_GEMM=1 TANDEM_SKINNY_MAX_ROWS=64"
  timeout 120 env $extra $NCU --clock-control none --launch-skip 1500 --launch-count 22 --metrics $M --csv --print-units base \
    "$B/engine_bench" $ARGS --iters 10 > "$R/ncu_$v.csv" 2>&1
  echo "$v rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
done
dc_finish
