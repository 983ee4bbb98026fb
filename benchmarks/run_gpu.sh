#!/usr/bin/env bash
# The GPU checks and benchmarks of one session on a CUDA machine; CSVs and logs under $1 (default: gpu-logs/).
#
#   bash benchmarks/run_gpu.sh OUTDIR smoke                 # the GPU smoke tier: every entry point and kernel version once
#   bash benchmarks/run_gpu.sh OUTDIR tests                 # the whole GPU suite, in parallel workers (CPU-bound compiles);
#   DEADLINE=420 STATE=S.json bash benchmarks/run_gpu.sh OUTDIR tests   # or in calls of 420 s, repeated until it
#                                                           # says "nothing left"
#   bash benchmarks/run_gpu.sh OUTDIR lessons
#   bash benchmarks/run_gpu.sh OUTDIR bench-tensor-cores    # one benchmark at a time: timings need the GPU alone
#   bash benchmarks/run_gpu.sh OUTDIR bench-tensor-core-tiles
#   bash benchmarks/run_gpu.sh OUTDIR bench-example-32k
#   bash benchmarks/run_gpu.sh OUTDIR bench-backward
#   bash benchmarks/run_gpu.sh OUTDIR bench-backward-tensor-cores
#   bash benchmarks/run_gpu.sh OUTDIR bench-flex bench-hopper-fp8
#   bash benchmarks/run_gpu.sh OUTDIR bench-decode
#   bash benchmarks/run_gpu.sh OUTDIR bench-training-step bench-decode-whole-call
#   bash benchmarks/run_gpu.sh OUTDIR gpt cold-start accuracy   # the example and the scripts beside the benchmarks
#
# Run from the repository root; tinyflash is imported from this checkout's src/. The tests steps run
# benchmarks/gpu_tests.py: the GPU suite's tests in parallel pytest-xdist workers (most of their time is
# numba compiling kernels and NumPy computing float64 references, both on the CPU), one CSV row per
# file and call in OUTDIR/gpu_tests_$DEVICE.csv (smoke writes OUTDIR/gpu_smoke_$DEVICE.csv), its log beside it. A benchmark step runs
# `python -m tinyflash.bench NAME` and writes OUTDIR/<its record name>_$DEVICE.csv, the name the
# record gives it in figures/data/ (tensor_cores_h200.csv, ...), and a log beside it; a CSV goes into
# figures/data/ once its rows are checked. DEVICE (default h200) names the GPU in the files' names. DEADLINE
# (seconds, unset: none) stops a tests step then, its rows keeping the tests that ended: set it under the time one
# call may run. STATE (a JSON file kept between the calls, outside OUTDIR when OUTDIR is new each call) names the
# tests that ended at this commit: the next call runs the others and adds its rows to OUTDIR's CSV.
set -uo pipefail
out=${1:-gpu-logs}
mkdir -p "$out"
shift
py=${PYTHON:-python3}
device=${DEVICE:-h200}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

bench() {  # bench NAME: one declared benchmark into the CSV the record names for it
  local stem
  stem=$($py -c "from tinyflash.bench.suites import BENCHMARKS; print(BENCHMARKS['$1'].csv_stem)") || return 1
  $py -m tinyflash.bench "$1" --csv "$out/${stem}_$device.csv" 2>&1 | tee "$out/${stem}_$device.log"
}

status=0
for what in "$@"; do
  case $what in
    tests) $py benchmarks/gpu_tests.py "$out/gpu_tests_$device.csv" ${DEADLINE:+--deadline "$DEADLINE"} \
             ${STATE:+--state "$STATE"} || status=1 ;;
    smoke) $py benchmarks/gpu_tests.py "$out/gpu_smoke_$device.csv" --smoke || status=1 ;;
    lessons)
      $py lessons/run_all.py > "$out/lessons_$device.log" 2>&1 || status=1
      tail -n 5 "$out/lessons_$device.log" ;;
    bench-tensor-cores) bench tensor-cores || status=1 ;;
    bench-tensor-core-tiles) bench tensor-core-tiles || status=1 ;;
    bench-example-32k) bench example-32k || status=1 ;;
    bench-backward) bench backward || status=1 ;;
    bench-backward-tensor-cores) bench backward-tensor-cores || status=1 ;;
    bench-flex) bench flex || status=1 ;;
    bench-hopper-fp8) bench hopper-fp8 || status=1 ;;
    bench-decode) bench decode || status=1 ;;
    bench-training-step) bench training-step || status=1 ;;
    bench-decode-whole-call) bench decode-whole-call || status=1 ;;
    gpt) $py examples/train_gpt.py --csv "$out/gpt_training_$device.csv" 2>&1 | tee "$out/gpt_training_$device.log" || status=1 ;;
    cold-start) $py benchmarks/cold_start.py "$out/cold_start_$device.csv" 2>&1 | tee "$out/cold_start_$device.log" || status=1 ;;
    accuracy) $py benchmarks/accuracy.py "$out/accuracy_$device.csv" 2>&1 | tee "$out/accuracy_$device.log" || status=1 ;;
    *) echo "unknown step: $what (steps: smoke tests lessons bench-tensor-cores bench-tensor-core-tiles" \
            "bench-example-32k bench-backward bench-backward-tensor-cores bench-flex bench-hopper-fp8 bench-decode" \
            "bench-training-step" \
            "bench-decode-whole-call gpt cold-start accuracy)" >&2; exit 2 ;;
  esac
done
exit $status
