#!/usr/bin/env bash
# Hardware counters of tinyflash's CUDA-core kernel (v5) and of PyTorch's memory-efficient SDPA kernel,
# both float32, B=1, H=32, N=4096, d=128, with Nsight Compute (ncu must be on the PATH and allowed
# to read the counters; clocks are left alone). Run from the repository root with tinyflash importable:
#
#     PYTHONPATH=$PWD/src bash benchmarks/profile_ncu.sh > profile_ncu_h200.log 2>&1
#
# What to read: smsp__inst_executed_pipe_fma.sum counts warp instructions on the FP32 pipe
# (FFMA, FMUL, FADD); the same attention is 4·32·4096²·128 FLOPs = 1.37e11 FMAs = 4.3e9 warp FFMAs (32 lanes each) if done
# on CUDA cores. sm__inst_executed_pipe_tensor* count tensor-core (MMA) instructions.
# smsp__issue_active is how often a scheduler issued; the stall ratios say what the
# warps waited for, per issued instruction.
set -u
METRICS="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__inst_executed_pipe_fma.sum,\
smsp__inst_executed_op_shared_ld.sum,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,\
regex:^sm__inst_executed_pipe_tensor.*\.sum$,\
regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
here=$(dirname "$0")
for which in tinyflash torch; do
    echo "=== $which, float32, B=1 H=32 N=4096 d=128"
    ncu --clock-control none -k 'regex:flash_fwd|fmha' --launch-skip 1 --launch-count 1 --metrics "$METRICS" \
        python3 -W ignore "$here/profile_target.py" "$which" 128 2>&1 | grep -v '^==PROF=='
done
