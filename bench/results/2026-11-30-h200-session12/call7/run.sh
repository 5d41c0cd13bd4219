source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
DC_TEST_S=200 dc_test cluster_gemm "$B/cluster_gemm_cuda_test"
timeout 200 $B/decode_gemm_bench --shapes o=4096x4096,down=4096x14336 --rows 48,64 --plans 64x2 --trace --layers 16 > $R/trace.txt 2>&1
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 48,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench all=engine_bench,TANDEM_CLUSTER_GEMM=1 > "$R/ab.log" 2>&1
dc_finish
