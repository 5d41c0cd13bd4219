set -x
source bench/engine/device_call.sh
dc_setup
nvidia-smi -L > $R/smi.txt 2>&1
DC_TEST_S=200 dc_test cluster_gemm "$B/cluster_gemm_cuda_test"
cat $R/tests.txt
timeout 240 $B/decode_gemm_bench --rows 33,48,64 --json $R/gemm.json > $R/gemm.txt 2>&1
echo rc=$? >> $R/gemm.txt
cat $R/gemm.txt
dc_finish
