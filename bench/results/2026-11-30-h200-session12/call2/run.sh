source bench/engine/device_call.sh
dc_setup
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
S="--section SpeedOfLight --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for c in "gate_up=28672x4096 256x1" "down=4096x14336 64x2" "o=4096x4096 64x2" "down=4096x14336 128x4"; do
  set -- $c
  timeout 60 $NCU --clock-control none --kernel-name regex:ClusterGemm --launch-skip 2 --launch-count 1 $S \
    $B/decode_gemm_bench --shapes $1 --rows 64 --layers 4 --iters 1 --skip-cublaslt --plans $2 > $R/ncu_ours_${1%%=*}_$2.txt 2>&1
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,launch__grid_size,launch__block_size,launch__cluster_dim_x,launch__cluster_dim_y,launch__cluster_dim_z,launch__shared_mem_per_block_dynamic,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.avg.per_cycle_active
for sh in gate_up=28672x4096 down=4096x14336 o=4096x4096 qkv=6144x4096; do
  TANDEM_GEMM_AUTOTUNE_LOG=1 timeout 90 $NCU --clock-control none --launch-count 300 --metrics $M --csv --print-units base \
    $B/decode_gemm_bench --shapes $sh --rows 64 --layers 2 --iters 1 --plans none > $R/ncu_lt_${sh%%=*}.csv 2>&1
done
# Timing again, all shapes, with more layers for steadier numbers.
timeout 200 $B/decode_gemm_bench --rows 64 --json $R/gemm.json > $R/gemm.txt 2>&1
dc_finish
# (The ncu_lt_*.csv files were cut to the autotune log and the last 12 kernels' rows afterwards.)
