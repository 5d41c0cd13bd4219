#!/usr/bin/env bash
# Session 11, call 2: does cuBLASLt take part in programmatic dependent launch? (pdl_probe.cu)
set -u
R="$OUT/r"; mkdir -p "$R"
export NCCL_NVLS_ENABLE=0
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
ls -la /usr/local/cuda/lib64/libcublasLt.so* > "$R/libs.txt" 2>&1
$NVCC -std=c++17 -arch=sm_90a -o /tmp/pdl_probe gpu-pack/pdl_probe.cu (archived as pdl_probe.cu.txt) -lcublasLt -lcuda > "$R/build.txt" 2>&1
for n in 4096 6144 28672; do timeout 60 /tmp/pdl_probe $n 200000 > "$R/probe_$n.txt" 2>&1; echo "probe $n rc=$?" >> "$R/rc.txt"; done
$NVCC -arch=sm_90a -cubin -o /tmp/gdc.cubin gpu-pack/gdc.cu (gdc.cu.txt) && $CUOBJ -sass /tmp/gdc.cubin > "$R/gdc_sass.txt" 2>&1
T0=$(date +%s)
timeout 150 $CUOBJ -sass -fun nvjet_sm90_tst_64x32_64x16_1x2_h_bz_TNT /usr/local/cuda/lib64/libcublasLt.so.13 > "$R/nvjet_o.sass" 2>&1
echo "cuobjdump rc=$? $(( $(date +%s) - T0 )) s" >> "$R/rc.txt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
