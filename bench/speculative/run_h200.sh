#!/usr/bin/env bash
# One device call (one H100/H200, bundle of tools/gpu-pack carried, models/draft in the tree):
# speculative verification on the CUDA engine (issue 25). Results in $OUT/r.tgz.
#   1. GPU tests: the step plan (verifying chunks as decode rows), the runner against the CPU
#      reference with verifying steps graphed and their rows sampled on the GPU, the engine's
#      speculative tests;
#   2. engine_bench on a synthesized llama-3-8b: decode at batch 1 and 32 (the ceilings in the
#      same run) and verification of k = 1, 2, 4, 8 drafts against the plain step, with the
#      speedup each bounds at acceptance 0.5 / 0.7 / 0.9;
#   3. spec_e2e_bench on that model: the engine end to end at batch 1 and 32 with drafts right
#      50% / 70% / 90% of the time, its outputs checked against plain decoding;
#   4. end to end at batch 1 (bench/speculative/batch1.sh, DEVICE=cuda): plain, n-gram and the
#      draft model on the copy-heavy and natural prompts, with MODEL (default models/draft, the
#      trained model that travels with the binaries; a synthesized 8B has random weights, whose
#      outputs copy nothing).
# STEPS (default "tests bench e2e batch1") picks which of the four run.
set -u
steps=" ${STEPS:-tests bench e2e batch1} "
source bench/engine/device_call.sh
dc_setup || exit 1
dc_synth llama-3-8b /tmp/tandem_m8b
if [[ $steps == *" tests "* ]]; then
  DC_TEST_S=120 dc_test step_plan "$B/cuda_step_plan_test"
  DC_TEST_S=200 dc_test runner "$B/cuda_model_runner_test" \
    --gtest_filter='Models/MixedBatchTest.*:CudaRunnerTest.GraphsOnAndOffGiveTheSameLogits'
  DC_TEST_S=120 dc_test engine_speculative "$B/engine_speculative_test"
fi
dc_wait_synth
if [[ $steps == *" bench "* ]]; then
  timeout 240 "$B/engine_bench" --model /tmp/tandem_m8b --batches 1,32 --contexts 1024 \
    --verify-batches 1,32 --verify-k 0,1,2,4,8 --skip sampling,prefill,profile,gemv-ab,skinny-ab \
    --json "$R/engine_bench_8b_verify.json" > "$R/engine_bench_8b_verify.txt" 2>&1
  echo "engine_bench rc=$?" >> "$R/tests.txt"
fi
if [[ $steps == *" e2e "* ]]; then
  # The engine end to end at a controlled acceptance: batch 1 and 32, 512-token prompts.
  # The trained model first (its argmax margins are a trained model's), then the 8B shape.
  timeout 120 "$B/spec_e2e_bench" --model models/draft --device cuda --requests 8 \
    --prompt-len 256 --output-len 128 --k 4 --acceptance 0.5,0.7,0.9 --check-batching \
    --json "$R/spec_e2e_draft_b1.json" > "$R/spec_e2e_draft_b1.txt" 2>&1
  echo "spec_e2e_bench draft b1 rc=$?" >> "$R/tests.txt"
  timeout 150 "$B/spec_e2e_bench" --model /tmp/tandem_m8b --device cuda --requests 4 \
    --prompt-len 512 --output-len 128 --k 4 --acceptance 0.5,0.7,0.9 --check-batching \
    --json "$R/spec_e2e_8b_b1.json" > "$R/spec_e2e_8b_b1.txt" 2>&1
  echo "spec_e2e_bench b1 rc=$?" >> "$R/tests.txt"
  timeout 150 "$B/spec_e2e_bench" --model /tmp/tandem_m8b --device cuda --requests 64 \
    --concurrency 32 --prompt-len 512 --output-len 128 --k 4 --acceptance 0.5,0.7,0.9 \
    --kv-cache-mib 8192 --json "$R/spec_e2e_8b_b32.json" > "$R/spec_e2e_8b_b32.txt" 2>&1
  echo "spec_e2e_bench b32 rc=$?" >> "$R/tests.txt"
fi
rm -rf /tmp/tandem_m8b
if [[ $steps == *" batch1 "* ]]; then
  OUT="$R/spec-e2e" TANDEM="$B/tandem" MODEL="${MODEL:-models/draft}" DRAFT=models/draft \
    DEVICE=cuda DRAFTERS=ngram PROMPTS="${PROMPTS:-8}" timeout 240 bash bench/speculative/batch1.sh \
    > "$R/spec-e2e.log" 2>&1
  echo "batch1 rc=$?" >> "$R/tests.txt"
fi
dc_finish
