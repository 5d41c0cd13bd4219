#!/usr/bin/env bash
# Session 5, call 1: decode-attention changes (tests + A/B against the 45a3368 baseline).
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
xz -dc gpu-pack/engine_bench_base.xz > build-gpu/gpu-out/bin/engine_bench_base && chmod +x build-gpu/gpu-out/bin/engine_bench_base
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
( [[ -f /tmp/tandem_m8b/config.json ]] || timeout 250 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1; echo "synth rc=$? $(date)" >> $R/synth.log ) &
SP=$!
T0=$(date +%s)
{
for t in attention_cuda_test rmsnorm_cuda_test elementwise_cuda_test; do
  echo "=== $t"; timeout 120 $B/$t 2>&1 | tail -5; echo "rc=${PIPESTATUS[0]}"
done
echo "=== attention_cuda_test decode unpacked"
TANDEM_DECODE_PACK_LO=0 timeout 120 $B/attention_cuda_test --gtest_filter='*Decode*' 2>&1 | tail -4; echo "rc=${PIPESTATUS[0]}"
} > $R/tests.txt 2>&1
echo "tests done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
wait $SP
echo "synth done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
D="--batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab"
for i in 1 2; do
  timeout 100 $B/engine_bench_base --model /tmp/tandem_m8b $D > $R/base_$i.txt 2>&1
  timeout 100 $B/engine_bench --model /tmp/tandem_m8b $D > $R/new_$i.txt 2>&1
done
TANDEM_DECODE_PACK_LO=0 timeout 100 $B/engine_bench --model /tmp/tandem_m8b $D > $R/new_unpacked.txt 2>&1
timeout 150 $B/engine_bench --model /tmp/tandem_m8b --skip sampling,gemv-ab,skinny-ab > $R/new_full.txt 2>&1
echo "all done $(( $(date +%s) - T0 )) s" >> $R/tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r
