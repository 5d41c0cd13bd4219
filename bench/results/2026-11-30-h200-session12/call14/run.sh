source bench/engine/device_call.sh
dc_setup
dc_synth llama-3.2-1b /tmp/tandem_m1b
dc_synth llama-3-8b /tmp/tandem_m8b
dc_wait_synth
timeout 100 $B/engine_bench --model /tmp/tandem_m1b --skip sampling,prefill,gemv-ab,skinny-ab,profile --json $R/engine_bench_1b.json > $R/engine_bench_1b.log 2>&1
echo "1b rc=$?" >> $R/tests.txt
timeout 100 $B/engine_bench --model /tmp/tandem_m8b --batches 1,8,48,64,256 --contexts 1024 --skip sampling,prefill,gemv-ab,skinny-ab,profile --json $R/engine_bench_8b.json > $R/engine_bench_8b.log 2>&1
echo "8b rc=$?" >> $R/tests.txt
dc_finish
