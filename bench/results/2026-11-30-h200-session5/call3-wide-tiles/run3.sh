#!/usr/bin/env bash
# Session 5, call 3: 128-key wgmma prefill attention: tests, A/B against 64-key tiles, ncu.
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
( [[ -f /tmp/tandem_m8b/config.json ]] || timeout 250 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1; echo "synth rc=$?" >> $R/synth.log ) &
SP=$!
T0=$(date +%s)
run_t() { local name=$1; shift; echo "=== $name"; timeout 120 env "$@" > $R/t.log 2>&1; local rc=$?; grep -E "^\[  (PASSED|FAILED|SKIPPED)  \]|tests ran|Failure|max_err|Expected|Which is" $R/t.log | head -20; echo "rc=$rc"; }
{
run_t attention_cuda_test $B/attention_cuda_test
run_t wide_3_stages TANDEM_PREFILL_SM90_STAGES=3 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t narrow TANDEM_PREFILL_SM90_WIDE=0 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t narrow_2_stages TANDEM_PREFILL_SM90_WIDE=0 TANDEM_PREFILL_SM90_STAGES=2 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t one_head TANDEM_PREFILL_SM90_HEADS=1 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t mma_sync TANDEM_PREFILL_ATTN_SM90=0 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t decode_unpacked TANDEM_DECODE_PACK_LO=0 $B/attention_cuda_test --gtest_filter='*Decode*'
run_t wgmma_probe $B/wgmma_probe_cuda_test
} > $R/tests.txt 2>&1
rm -f $R/t.log
echo "tests done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
wait $SP
M=/tmp/tandem_m8b
P="--batches 1 --contexts 1024 --prefill 512,2048,8192 --skip sampling,profile,gemv-ab,skinny-ab"
for i in 1 2; do
  timeout 60 $B/engine_bench --model $M $P > $R/pre_wide2_$i.txt 2>&1
  timeout 60 env TANDEM_PREFILL_SM90_STAGES=3 $B/engine_bench --model $M $P > $R/pre_wide3_$i.txt 2>&1
  timeout 60 env TANDEM_PREFILL_SM90_WIDE=0 $B/engine_bench --model $M $P > $R/pre_narrow_$i.txt 2>&1
done
timeout 150 $B/engine_bench --model $M --skip sampling,gemv-ab,skinny-ab > $R/full.txt 2>&1
echo "bench done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
timeout 150 $NCU --kernel-name regex:PrefillAttentionSm90 --launch-skip 31 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  $B/engine_bench --model $M --batches 1 --contexts 1024 --prefill 8192 --skip sampling,profile,gemv-ab,skinny-ab > $R/ncu_wide2.txt 2>&1
echo "all done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
for f in $R/*.txt; do grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
