source bench/engine/device_call.sh
dc_setup
dc_synth llama-3-8b /tmp/tandem_m8b
dc_synth llama-3.2-1b /tmp/tandem_m1b
DC_TEST_S=200 dc_test cluster_gemm "$B/cluster_gemm_cuda_test"
dc_wait_synth
timeout 200 $B/engine_bench --model /tmp/tandem_m8b --skip sampling,gemv-ab,skinny-ab --json $R/engine_bench_8b.json > $R/engine_bench_8b.log 2>&1
echo "8b rc=$?" >> $R/tests.txt
timeout 100 $B/engine_bench --model /tmp/tandem_m1b --skip sampling,prefill,gemv-ab,skinny-ab,profile --json $R/engine_bench_1b.json > $R/engine_bench_1b.log 2>&1
echo "1b rc=$?" >> $R/tests.txt
bash bench/engine/ab.sh "$R/ab" 2 "$B" "--model /tmp/tandem_m8b --batches 1,8,48,64,256 --contexts 1024 --skip sampling,prefill,profile,gemv-ab,skinny-ab" base=engine_bench_base new=engine_bench > "$R/ab.log" 2>&1
dc_finish
