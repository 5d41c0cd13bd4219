#!/usr/bin/env bash
# Session 10, call 10 (bundle of 07075e4): Nsight Compute of one decode attention launch at batch
# 64, 1K (one item per CTA, TANDEM_DECODE_CHAIN=0) with the cache read evict-first and with no
# policy: duration, DRAM bytes and throughput, L2 hit / miss sectors of the reads.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
T0=$(date +%s)
dc_wait_synth
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__t_sectors_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_ltcfabric.sum
for ef in 1 0; do
  timeout 70 env TANDEM_DECODE_CHAIN=0 TANDEM_DECODE_EVICT_FIRST=$ef $NCU --kernel-name regex:DecodeAttentionKernel --launch-skip 40 --launch-count 1 --metrics $M \
    "$B/engine_bench" --model /tmp/tandem_m8b --batches 64 --contexts 1024 --iters 2 --skip sampling,prefill,profile,gemv-ab,skinny-ab > "$R/ncu_ef$ef.txt" 2>&1
  echo "ef=$ef rc=$? ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
done
dc_finish
