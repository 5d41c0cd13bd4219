#!/usr/bin/env bash
# Session 11, call 12 (bundle of 1776ec2, base 95a8c2f): the shared warp-tile copy of the decode
# attention (a refactor that changed register counts): every attention test (and the decode cases
# unchained), A/B at batch 1 / 8 / 64 / 256, 1K.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=120
dc_test attention "$B/attention_cuda_test"
dc_test decode_unchained TANDEM_DECODE_CHAIN=0 "$B/attention_cuda_test" --gtest_filter='*Decode*'
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1,8,64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench_base new=engine_bench > "$R/ab.log" 2>&1
dc_finish
