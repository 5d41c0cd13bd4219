source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
DC_TEST_S=200 dc_test cluster_gemm "$B/cluster_gemm_cuda_test"
dc_wait_synth
Q=TANDEM_CLUSTER_GEMM_MIN_FILL=0.7
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 40,48,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench all=engine_bench,TANDEM_CLUSTER_GEMM=1 allqkv=engine_bench,TANDEM_CLUSTER_GEMM=1,$Q,TANDEM_CLUSTER_GEMM_SHAPES=4096x4096:4096x14336:6144x4096 oqkv=engine_bench,TANDEM_CLUSTER_GEMM=1,$Q,TANDEM_CLUSTER_GEMM_SHAPES=4096x4096:6144x4096 > "$R/ab.log" 2>&1
timeout 100 $B/decode_gemm_bench --shapes qkv=6144x4096,o=4096x4096,down=4096x14336 --rows 40,48,64 > $R/gemm.txt 2>&1
dc_finish
