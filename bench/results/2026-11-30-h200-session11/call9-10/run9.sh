#!/usr/bin/env bash
# Session 11, calls 9 and 10 (right after call 8; call 10 repeats call 9 with its output packed in one archive, same warm machine and build-gpu/; models/ carried,
# bench/results left out): the model tests.
export LD_LIBRARY_PATH=$PWD/build-gpu/gpu-out/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/build-gpu/gpu-out/ucx NCCL_NVLS_ENABLE=0
OUT=$OUT/x TANDEM_MODELS_DIR=$PWD/models BIN=build-gpu/gpu-out/bin ONLY="cuda_model_runner_test cuda_model_runner_test_fused_norm cuda_model_runner_test_gemm_splitk cuda_model_runner_test_no_skinny_gemm cuda_model_runner_test_skinny_gemm cuda_model_runner_test_unfused_qkv_rope cuda_generate_test cuda_runner_sampling_test disagg_cuda_test serve_cuda_smoke" bash bench/engine/run_h200.sh > $OUT/log.txt 2>&1
