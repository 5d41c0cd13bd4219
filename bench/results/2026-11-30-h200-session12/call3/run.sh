source bench/engine/device_call.sh
dc_setup
SH="o1k=4096x1024,o2k=4096x2048,o=4096x4096,o8k=4096x8192,o16k=4096x16384"
timeout 250 $B/decode_gemm_bench --shapes $SH --rows 1,64 --plans 64x1,64x2,128x1,128x2 --json $R/ksweep.json > $R/ksweep.txt 2>&1
timeout 100 $B/decode_gemm_bench --shapes qkv=6144x4096,down=4096x14336,gate_up=28672x4096 --rows 1,64 --skip-cublaslt --json $R/m1.json > $R/m1.txt 2>&1
dc_finish
