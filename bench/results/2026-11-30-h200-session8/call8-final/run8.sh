#!/usr/bin/env bash
# Session 8, call 8: the final code (2c91a4e = 73b6c2f's code): engine_bench on the Llama-3-8B
# shape (every section) and the Llama-3.2-1B shape (decode), leaving build-gpu/ for call 9.
set -u
R=$OUT/r; mkdir -p $R
rm -rf build-gpu && mkdir -p build-gpu && tar -xJf gpu-pack/bundle.tar.xz -C build-gpu
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
B=build-gpu/gpu-out/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
timeout 100 $B/tandem model synth --like llama-3-8b --out /tmp/tandem_m8b > $R/synth.log 2>&1
timeout 100 $B/tandem model synth --like llama-3.2-1b --out /tmp/tandem_m1b >> $R/synth.log 2>&1
timeout 200 $B/engine_bench --model /tmp/tandem_m8b --skip sampling,gemv-ab,skinny-ab --json $R/engine_bench_8b.json > $R/engine_bench_8b.log 2>&1
echo "8b rc=$?" >> $R/synth.log
timeout 100 $B/engine_bench --model /tmp/tandem_m1b --batches 1,8,64 --contexts 1024,8192 --skip sampling,prefill,profile,gemv-ab,skinny-ab --json $R/engine_bench_1b.json > $R/engine_bench_1b.log 2>&1
echo "1b rc=$?" >> $R/synth.log
for f in $R/*.log; do grep -v "^loading weights" $f > $f.tmp; mv $f.tmp $f; done
cd $OUT && tar czf r.tgz r && rm -rf r
