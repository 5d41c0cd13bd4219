#!/usr/bin/env bash
# Session 9, call 3 (commit COMMIT, an ablation build, reverted after): where the prefill attention's
# time goes. The warp-specialized kernels at prefill 8K with the producer's copies skipped (16), the
# consumers' softmax skipped (32), both (48); PyTorch SDPA on one layer's causal 8K attention as a
# reference; the SASS of the three kernels; Nsight source counters of ws.
set -u
source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
T0=$(date +%s)
timeout 60 python3 gpu-pack/sdpa.py > "$R/sdpa.txt" 2>&1
CO=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump)
$CO -sass "$B/engine_bench" 2>/dev/null | awk '/Function : /{p = ($0 ~ /PrefillAttentionSm90KernelILi3ELi2ELi128/)} p' > "$R/sass.txt"
echo "sdpa+sass ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_wait_synth
W1=TANDEM_PREFILL_SM90_WS=1 W2=TANDEM_PREFILL_SM90_WS=2 A=TANDEM_PREFILL_SM90_ABLATE
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 5 --prefill 8192 --skip sampling,profile,gemv-ab,skinny-ab" \
  ws=engine_bench,$W1 ws_noload=engine_bench,$W1,$A=16 ws_nosoftmax=engine_bench,$W1,$A=32 ws_neither=engine_bench,$W1,$A=48 \
  pp=engine_bench,$W2 pp_noload=engine_bench,$W2,$A=16 pp_nosoftmax=engine_bench,$W2,$A=32 base=engine_bench > "$R/ab.log" 2>&1
echo "ab done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
timeout 150 env $W1 $NCU --kernel-name regex:PrefillAttentionSm90 --launch-skip 31 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
  "$B/engine_bench" --model /tmp/tandem_m8b --batches 1 --contexts 1024 --iters 5 --prefill 8192 --skip sampling,profile,gemv-ab,skinny-ab > "$R/ncu_ws1.txt" 2>&1
echo "all done ($(( $(date +%s) - T0 )) s)" >> "$R/tests.txt"
dc_finish
