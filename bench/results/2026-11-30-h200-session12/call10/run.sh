source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
DC_TEST_S=200 dc_test cluster_gemm "$B/cluster_gemm_cuda_test"
dc_wait_synth
C=TANDEM_CLUSTER_GEMM=1
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m8b --batches 48,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench c4=engine_bench_base,$C new=engine_bench,$C s10=engine_bench,$C,TANDEM_CLUSTER_GEMM_STAGES=10 s8=engine_bench,$C,TANDEM_CLUSTER_GEMM_STAGES=8 > "$R/ab.log" 2>&1
timeout 100 $B/decode_gemm_bench --shapes o=4096x4096,down=4096x14336 --rows 64 --plans 64x2 --trace > $R/trace.txt 2>&1
dc_finish
