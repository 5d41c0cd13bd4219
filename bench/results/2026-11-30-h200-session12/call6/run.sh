source bench/engine/device_call.sh
dc_setup
timeout 200 $B/decode_gemm_bench --shapes o=4096x4096,down=4096x14336,qkv=6144x4096 --rows 64 --plans 64x2,128x2 --trace --layers 16 > $R/trace.txt 2>&1
dc_finish
