#!/usr/bin/env bash
# Session 5, call 10: decode attention with one table entry per tile (and 2 stages as a switch):
# tests, A/B against the dfc1eb2 build (same decode code as before this change).
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
xz -dc gpu-pack/engine_bench_base.xz > build-gpu/gpu-out/bin/engine_bench_base && chmod +x build-gpu/gpu-out/bin/engine_bench_base
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
( timeout 100 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1 ) &
SP=$!
run_t() { local name=$1; shift; echo "=== $name"; timeout 120 env "$@" > $R/t.log 2>&1; local rc=$?; grep -E "^\[  (PASSED|FAILED|SKIPPED)  \]|Failure|Expected|Which is" $R/t.log | head -20; echo "rc=$rc"; }
{
run_t attention_cuda_test $B/attention_cuda_test
run_t decode_2_stages TANDEM_DECODE_STAGES=2 $B/attention_cuda_test --gtest_filter='*Decode*'
run_t decode_unpacked TANDEM_DECODE_PACK_LO=0 $B/attention_cuda_test --gtest_filter='*Decode*'
} > $R/tests.txt 2>&1
rm -f $R/t.log
wait $SP
M=/tmp/tandem_m8b
D="--batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab"
for i in 1 2; do
  timeout 60 $B/engine_bench_base --model $M $D > $R/ab_base_$i.txt 2>&1
  timeout 60 $B/engine_bench --model $M $D > $R/ab_new_$i.txt 2>&1
  timeout 60 env TANDEM_DECODE_STAGES=2 $B/engine_bench --model $M $D > $R/ab_new2_$i.txt 2>&1
done
for f in $R/*.txt; do grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
