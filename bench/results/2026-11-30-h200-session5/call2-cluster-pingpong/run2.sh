#!/usr/bin/env bash
# Session 5, call 2: cluster merge (decode) and ping-pong (wgmma prefill): tests, A/B, ncu.
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
( [[ -f /tmp/tandem_m8b/config.json ]] || timeout 250 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1; echo "synth rc=$?" >> $R/synth.log ) &
SP=$!
T0=$(date +%s)
run_t() { local name=$1; shift; echo "=== $name"; timeout 120 env "$@" 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) \]|tests ran|Failure|error|max_err|Expected|Which is" | head -20; echo "rc=${PIPESTATUS[0]}"; }
{
run_t attention_cuda_test $B/attention_cuda_test
run_t decode_merge_kernel TANDEM_DECODE_CLUSTER_MERGE=0 $B/attention_cuda_test --gtest_filter='*Decode*'
run_t decode_unpacked TANDEM_DECODE_PACK_LO=0 $B/attention_cuda_test --gtest_filter='*Decode*'
run_t prefill_lockstep TANDEM_PREFILL_SM90_PINGPONG=0 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t prefill_pp3 TANDEM_PREFILL_SM90_STAGES=3 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t prefill_2_stages TANDEM_PREFILL_SM90_STAGES=2 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t prefill_1_head TANDEM_PREFILL_SM90_HEADS=1 $B/attention_cuda_test --gtest_filter='*Prefill*'
run_t prefill_mma_sync TANDEM_PREFILL_ATTN_SM90=0 $B/attention_cuda_test --gtest_filter='*Prefill*'
} > $R/tests.txt 2>&1
echo "tests done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
wait $SP
M=/tmp/tandem_m8b
D="--batches 1,8 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab"
P="--batches 1 --contexts 1024 --prefill 2048,8192 --skip sampling,profile,gemv-ab,skinny-ab"
timeout 150 $B/engine_bench --model $M --skip sampling,gemv-ab,skinny-ab > $R/full.txt 2>&1
for i in 1 2; do
  timeout 60 env TANDEM_DECODE_CLUSTER_MERGE=0 $B/engine_bench --model $M $D > $R/dec_mergekernel_$i.txt 2>&1
  timeout 60 $B/engine_bench --model $M $D > $R/dec_cluster_$i.txt 2>&1
  timeout 60 env TANDEM_PREFILL_SM90_PINGPONG=0 $B/engine_bench --model $M $P > $R/pre_lockstep_$i.txt 2>&1
  timeout 60 $B/engine_bench --model $M $P > $R/pre_pp4_$i.txt 2>&1
  timeout 60 env TANDEM_PREFILL_SM90_STAGES=3 $B/engine_bench --model $M $P > $R/pre_pp3_$i.txt 2>&1
done
echo "bench done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
timeout 150 $NCU --kernel-name regex:PrefillAttentionSm90 --launch-skip 31 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \
  $B/engine_bench --model $M --batches 1 --contexts 1024 --prefill 8192 --skip sampling,profile,gemv-ab,skinny-ab > $R/ncu_pp4.txt 2>&1
timeout 100 env TANDEM_PREFILL_SM90_PINGPONG=0 $NCU --kernel-name regex:PrefillAttentionSm90 --launch-skip 31 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  $B/engine_bench --model $M --batches 1 --contexts 1024 --prefill 8192 --skip sampling,profile,gemv-ab,skinny-ab > $R/ncu_lockstep.txt 2>&1
echo "all done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
for f in $R/*.txt; do grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
