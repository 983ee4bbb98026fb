#!/usr/bin/env bash
# The GPU checks and benchmarks of one session on a CUDA machine, logs under $1 (default: gpu-logs/).
#
#   bash benchmarks/run_gpu.sh LOGDIR tests            # every GPU test file, several at once (CPU-bound compiles)
#   bash benchmarks/run_gpu.sh LOGDIR bench-decode     # one benchmark at a time: timings need the GPU alone
#   bash benchmarks/run_gpu.sh LOGDIR bench-backward
#   bash benchmarks/run_gpu.sh LOGDIR bench-tensor-cores
#   bash benchmarks/run_gpu.sh LOGDIR lessons
#
# Run from the repository root with tinyflash importable (PYTHONPATH=$PWD/src). Test files run as
# separate pytest processes in parallel: most of their time is numba compiling kernels and NumPy
# computing float64 references, both on the CPU; the benchmarks run one after another.
set -uo pipefail
out=${1:-gpu-logs}
mkdir -p "$out"
shift
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
for what in "$@"; do
  case $what in
    tests)
      pids=()
      for group in "tests/test_cuda_gpu.py" "tests/test_tensor_core_gpu.py tests/test_tensor_core_ptx.py" \
                   "tests/test_backward_gpu.py" "tests/test_decode_kernels.py tests/test_decode_tensor_cores.py tests/test_gqa.py" \
                   "tests/test_nonfinite.py tests/test_gpu_runtime.py tests/test_commands.py"; do
        name=$(echo "$group" | awk '{print $1}' | sed 's#tests/##; s#\.py##')
        # shellcheck disable=SC2086
        $py -m pytest -q -p no:cacheprovider $group > "$out/gpu_tests_$name.log" 2>&1 &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid"; done
      tail -n 3 "$out"/gpu_tests_*.log ;;
    lessons) $py lessons/run_all.py > "$out/lessons_gpu.log" 2>&1; tail -n 5 "$out/lessons_gpu.log" ;;
    bench-decode) $py -m tinyflash.bench decode --csv "$out/decode_h200.csv" 2>&1 | tee "$out/decode_h200.log" ;;
    bench-backward) $py -m tinyflash.bench backward --csv "$out/backward_h200.csv" 2>&1 | tee "$out/backward_h200.log" ;;
    bench-tensor-cores)
      $py -m tinyflash.bench tensor-cores --csv "$out/tensor_cores_h200.csv" 2>&1 | tee "$out/tensor_cores_h200.log" ;;
    *) echo "unknown step: $what" >&2; exit 2 ;;
  esac
done
