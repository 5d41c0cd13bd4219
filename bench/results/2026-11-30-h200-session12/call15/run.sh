source bench/engine/device_call.sh
dc_setup
DC_TEST_S=120 dc_test cluster_gemm "$B/cluster_gemm_cuda_test"
DC_TEST_S=120 dc_test attention_prefill "$B/attention_cuda_test" --gtest_filter='*Prefill*'
DC_TEST_S=60 dc_test skinny_gemm "$B/skinny_gemm_cuda_test"
timeout 60 $B/decode_gemm_bench --shapes o=4096x4096,down=4096x14336 --rows 64 --plans 64x2 --layers 8 --iters 5 --trace > $R/trace.txt 2>&1
dc_finish
