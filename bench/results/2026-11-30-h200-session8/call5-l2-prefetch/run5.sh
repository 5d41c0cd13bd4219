#!/usr/bin/env bash
# Session 8, call 5: L2 prefetch hints before the cuBLASLt GEMMs (TANDEM_L2_PREFETCH_MB): kernel
# tests, then an A/B against the 73b6c2f build at 0 (off), 4, 8 and 16 MiB per GEMM.
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
( timeout 100 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1 ) &
SP=$!
run_t() { local name=$1; shift; echo "=== $name"; timeout 150 env "$@" > $R/t_$name.log 2>&1; local rc=$?; grep -E "^\[  (PASSED|FAILED|SKIPPED)  \]|Failure|Expected|Which is|differs|changed" $R/t_$name.log | head -20; echo "rc=$rc"; }
{
run_t rmsnorm $B/rmsnorm_cuda_test
run_t elementwise $B/elementwise_cuda_test
} > $R/tests.txt 2>&1
wait $SP
M=/tmp/tandem_m8b
bash bench/engine/ab.sh $R/ab 3 $B "--model $M --batches 8,64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base off=engine_bench pf4=engine_bench,TANDEM_L2_PREFETCH_MB=4 pf8=engine_bench,TANDEM_L2_PREFETCH_MB=8 pf16=engine_bench,TANDEM_L2_PREFETCH_MB=16 > $R/ab.log 2>&1
timeout 120 env TANDEM_L2_PREFETCH_MB=8 $B/engine_bench --model $M --batches 64 --contexts 1024 --prefill 512 --skip sampling,gemv-ab,skinny-ab > $R/profile_pf8.txt 2>&1
for f in $R/*.txt $R/ab/*.txt; do [ -f "$f" ] && { grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; }; done
cd $OUT && tar czf r.tgz r && rm -rf r
