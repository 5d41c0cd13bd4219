#!/usr/bin/env bash
# Session 9, call 2 (commit COMMIT): the ping-pong's barrier fix; tests of the warp-specialized
# variants, A/B at prefill 2K / 8K (base, ws, pp), SASS of the three kernels, Nsight on one 8K
# prefill attention launch of pp (ws if pp fails).
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
export DC_TEST_S=90
T0=$(date +%s)
ok=(base=engine_bench)
dc_test ws TANDEM_PREFILL_SM90_WS=1 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(ws=engine_bench,TANDEM_PREFILL_SM90_WS=1)
dc_test pp TANDEM_PREFILL_SM90_WS=2 "$B/attention_cuda_test" --gtest_filter='*Prefill*' && ok+=(pp=engine_bench,TANDEM_PREFILL_SM90_WS=2)
dc_test ws_2st TANDEM_PREFILL_SM90_WS=1 TANDEM_PREFILL_SM90_STAGES=2 "$B/attention_cuda_test" --gtest_filter='*Prefill*'
echo "variants: ${ok[*]}  ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
CO=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump)
for k in 0 1 2; do
  $CO -sass -fun "_ZN6tandem4cuda8internal12_GLOBAL__N_126PrefillAttentionSm90KernelILi3ELi2ELi128ELi${k}EEEvNS1_13PrefillParamsE" "$B/engine_bench" > "$R/sass_$k.txt" 2>&1
done
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 10 --prefill 2048,8192 --skip sampling,profile,gemv-ab,skinny-ab" "${ok[@]}" > "$R/ab.log" 2>&1
echo "ab done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
v=2; [[ " ${ok[*]} " == *" pp="* ]] || v=1
timeout 150 env TANDEM_PREFILL_SM90_WS=$v $NCU --kernel-name regex:PrefillAttentionSm90 --launch-skip 31 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
  "$B/engine_bench" --model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 5 --prefill 8192 --skip sampling,profile,gemv-ab,skinny-ab > "$R/ncu_ws$v.txt" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish
