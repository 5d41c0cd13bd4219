#!/usr/bin/env bash
# Session 8, call 10: the final code again on another machine start: decode batch 1 and 64 at 1K
# and prefill 2K / 8K, three runs each, for the spread between and within machine starts.
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv > $R/gpu.txt 2>&1
timeout 100 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1
bash bench/engine/ab.sh $R/ab 3 $B "--model /tmp/tandem_m8b --batches 1,64 --contexts 1024 --prefill 2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" final=engine_bench > $R/ab.log 2>&1
for f in $R/ab/*.txt; do [ -f "$f" ] && { grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; }; done
cd $OUT && tar czf r.tgz r && rm -rf r
