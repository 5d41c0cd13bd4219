#!/usr/bin/env bash
# Session 11, call 7 (bundle of 9691148): the wider cuBLASLt search (32 heuristic candidates plus
# split-K variants) timed after the memset flush and after the read-through flush, against the
# default (8 candidates, memset flush); Llama-3-8B batch 64 / 256 at 1K.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_wait_synth
timeout 100 env TANDEM_GEMM_AUTOTUNE_FLUSH=read TANDEM_GEMM_AUTOTUNE_CANDIDATES=32 TANDEM_GEMM_AUTOTUNE_SPLITK=1 TANDEM_GEMM_AUTOTUNE_LOG=1 "$B/engine_bench" --model /tmp/tandem_m8b --batches 64 --contexts 1024 --iters 20 --skip sampling,prefill,profile,gemv-ab,skinny-ab > "$R/log_read32.txt" 2>&1
bash bench/engine/ab.sh "$R/ab8b" 3 "$B" "--model /tmp/tandem_m8b --batches 64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench memset32=engine_bench,TANDEM_GEMM_AUTOTUNE_CANDIDATES=32,TANDEM_GEMM_AUTOTUNE_SPLITK=1 read32=engine_bench,TANDEM_GEMM_AUTOTUNE_FLUSH=read,TANDEM_GEMM_AUTOTUNE_CANDIDATES=32,TANDEM_GEMM_AUTOTUNE_SPLITK=1 > "$R/ab8b.log" 2>&1
dc_finish
