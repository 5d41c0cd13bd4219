#!/usr/bin/env bash
# Session 8, call 11: the final code's skinny GEMM split-K aim (TANDEM_SKINNY_CTAS_PER_SM 1-4) at
# batch 8-32 (its default rows) and with it taking 64 rows too (TANDEM_SKINNY_MAX_ROWS=64).
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
timeout 100 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1
bash bench/engine/ab.sh $R/ab 2 $B "--model /tmp/tandem_m8b --batches 8,16,32,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" \
  default=engine_bench a1=engine_bench,TANDEM_SKINNY_CTAS_PER_SM=1 a3=engine_bench,TANDEM_SKINNY_CTAS_PER_SM=3 a4=engine_bench,TANDEM_SKINNY_CTAS_PER_SM=4 \
  m64a1=engine_bench,TANDEM_SKINNY_MAX_ROWS=64,TANDEM_SKINNY_CTAS_PER_SM=1 m64a2=engine_bench,TANDEM_SKINNY_MAX_ROWS=64 m64a4=engine_bench,TANDEM_SKINNY_MAX_ROWS=64,TANDEM_SKINNY_CTAS_PER_SM=4 > $R/ab.log 2>&1
for f in $R/ab/*.txt; do [ -f "$f" ] && { grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; }; done
cd $OUT && tar czf r.tgz r && rm -rf r
