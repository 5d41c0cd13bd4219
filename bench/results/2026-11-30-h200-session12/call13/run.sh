source bench/engine/device_call.sh
dc_setup
dc_synth llama-3.2-1b /tmp/tandem_m1b
dc_wait_synth
bash bench/engine/ab.sh "$R/ab" 3 "$B" "--model /tmp/tandem_m1b --batches 48,64 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" default=engine_bench mt128=engine_bench,TANDEM_CLUSTER_GEMM_MAX_TILE=128 mt256=engine_bench,TANDEM_CLUSTER_GEMM_MAX_TILE=256 > "$R/ab.log" 2>&1
dc_finish
