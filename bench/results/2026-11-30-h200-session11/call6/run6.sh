#!/usr/bin/env bash
# Session 11, call 6 (bundle of 57af29d): GEMM autotuning with a read-through L2 flush and the
# activations cached (TANDEM_GEMM_AUTOTUNE_FLUSH=read) against the memset flush (default).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
dc_wait_synth
for f in memset read; do
  timeout 100 env TANDEM_GEMM_AUTOTUNE_FLUSH=$f TANDEM_GEMM_AUTOTUNE_LOG=1 "$B/engine_bench" --model /tmp/tandem_m8b --batches 64 --contexts 1024 --iters 20 --skip sampling,prefill,profile,gemv-ab,skinny-ab > "$R/log_$f.txt" 2>&1
done
bash bench/engine/ab.sh "$R/ab8b" 3 "$B" "--model /tmp/tandem_m8b --batches 48,64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" memset=engine_bench read=engine_bench,TANDEM_GEMM_AUTOTUNE_FLUSH=read > "$R/ab8b.log" 2>&1
bash bench/engine/ab.sh "$R/ab1b" 2 "$B" "--model /tmp/tandem_m1b --batches 64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" memset=engine_bench read=engine_bench,TANDEM_GEMM_AUTOTUNE_FLUSH=read > "$R/ab1b.log" 2>&1
bash bench/engine/ab.sh "$R/abpf" 1 "$B" "--model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 5 --prefill 2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" memset=engine_bench read=engine_bench,TANDEM_GEMM_AUTOTUNE_FLUSH=read > "$R/abpf.log" 2>&1
dc_finish
