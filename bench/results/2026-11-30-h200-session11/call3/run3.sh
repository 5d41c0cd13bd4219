#!/usr/bin/env bash
# Session 11, call 3 (bundle of fb0fdc2): timing only: captured edges into every cuBLASLt launch
# programmatic (TANDEM_GEMM_PDL_UNSAFE=1, no safety check) against the default, batch 64 / 256 at 1K.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench pdl=engine_bench,TANDEM_GEMM_PDL_UNSAFE=1 > "$R/ab.log" 2>&1
dc_finish
