#!/usr/bin/env bash
# Session 8, call 12: wide skinny GEMM for 33-64 rows (TANDEM_SKINNY_WIDE=1): its GPU test, then
# an A/B at batch 48 and 64 (1K) against the 73b6c2f build (cuBLASLt there), split-K aims 4 and 8.
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
( timeout 100 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1 ) &
SP=$!
timeout 60 env TANDEM_SKINNY_WIDE=1 $B/skinny_gemm_cuda_test > $R/t_wide.log 2>&1
echo "wide test rc=$?" > $R/tests.txt
grep -E "^\[  (PASSED|FAILED)|Failure" $R/t_wide.log | head -12 >> $R/tests.txt
wait $SP
bash bench/engine/ab.sh $R/ab 3 $B "--model /tmp/tandem_m8b --batches 48,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  base=engine_bench_base wide4=engine_bench,TANDEM_SKINNY_WIDE=1,TANDEM_SKINNY_MAX_ROWS=64,TANDEM_SKINNY_CTAS_PER_SM=4 \
  wide8=engine_bench,TANDEM_SKINNY_WIDE=1,TANDEM_SKINNY_MAX_ROWS=64,TANDEM_SKINNY_CTAS_PER_SM=8 > $R/ab.log 2>&1
timeout 60 env TANDEM_SKINNY_WIDE=1 TANDEM_SKINNY_MAX_ROWS=64 TANDEM_SKINNY_CTAS_PER_SM=4 $B/engine_bench --model /tmp/tandem_m8b --batches 64 --contexts 1024 --prefill 512 --skip sampling,gemv-ab,skinny-ab > $R/profile_wide4.txt 2>&1
for f in $R/*.txt $R/ab/*.txt; do [ -f "$f" ] && { grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; }; done
cd $OUT && tar czf r.tgz r && rm -rf r
