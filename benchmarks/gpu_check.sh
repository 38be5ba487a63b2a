#!/usr/bin/env bash
# GPU check of sol_ext: build the CUDA kernels for the visible GPU, run the whole test suite (the CUDA
# cases included), benchmark StochasticOrderLoss on the GPU, and print a short summary table last.
#
#   bash benchmarks/gpu_check.sh              # from the repository root (any cwd works)
#
# Environment: PYTHON (default python3), OUT (logs and bench JSON are copied there when set),
# TORCH_CUDA_ARCH_LIST (default: the compute capability nvidia-smi reports), MAX_JOBS (default nproc),
# PYTEST_ARGS (default "-q tests"), BENCH_SIZES (default: the three performance targets).
# Needs no network. Budget: build ~2-3 min, tests ~2-4 min, bench ~1-2 min.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
LOG=${OUT:-${TMPDIR:-/tmp}/sol_ext_gpu_check}
mkdir -p "$LOG"
declare -A STATUS SECONDS_TAKEN

run_step() {  # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*" | tee -a "$LOG/summary.log"
  local start=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
  local rc=$?
  SECONDS_TAKEN[$name]=$((SECONDS - start))
  STATUS[$name]=$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc=$rc)")
  echo "=== $name: ${STATUS[$name]} in ${SECONDS_TAKEN[$name]} s" | tee -a "$LOG/summary.log"
  return $rc
}

# --- environment -----------------------------------------------------------------------------------
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv | tee "$LOG/gpu.txt"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' ')
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch}
export CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export SOL_EXT_FORCE_CUDA=1
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"

# --- build (in place: the tests and the benchmark import the package from this folder) ---------------
if ! run_step build 420 "$PY" setup.py build_ext --inplace; then
  echo "build failed; see $LOG/build.log"
  exit 1
fi
run_step kernels 60 "$PY" -c "
import torch, sol_ext
assert sol_ext.cuda_kernels_available(), 'built without CUDA kernels'
assert torch.cuda.is_available(), 'no GPU visible to torch'
h = torch.randn(8, 4, device='cuda', requires_grad=True); mu = torch.randn(5, 4, device='cuda')
loss = sol_ext.StochasticOrderLoss(5, backend='fused')(h, torch.arange(8, device='cuda') % 5, mu)
loss.backward(); torch.cuda.synchronize(); print('smoke test ok, loss', loss.item())
" || exit 1

# --- tests: the CUDA-specific file first (fast feedback), then the whole suite ----------------------
run_step test_cuda 180 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_cuda.py
# shellcheck disable=SC2086
# the driver on the GPU, float32 and mixed precision (float16 + GradScaler)
run_step driver 240 "$PY" -m sol_ext train --device cuda --epochs 3 --no-plots --output "$LOG/run-fp32" --overwrite
run_step driver_amp 240 "$PY" -m sol_ext train --device cuda --amp --epochs 3 --no-plots --output "$LOG/run-amp" --overwrite
run_step tests 420 "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests}

# --- benchmark -----------------------------------------------------------------------------------
# shellcheck disable=SC2086
run_step bench 300 "$PY" benchmarks/bench_loss.py --device cuda --min-run-time 0.5 --json "$LOG/bench.json" \
  --sizes ${BENCH_SIZES:-64,60,512 1024,101,512 4096,217,512}

# --- summary, last ---------------------------------------------------------------------------------
echo
echo "## sol_ext GPU check ($(head -n 2 "$LOG/gpu.txt" | tail -n 1))"
echo
echo "| step | status | seconds |"
echo "| --- | --- | --- |"
for name in build kernels test_cuda tests bench; do
  echo "| $name | ${STATUS[$name]:-not run} | ${SECONDS_TAKEN[$name]:-} |"
done
for name in test_cuda tests; do
  [ -f "$LOG/$name.log" ] && echo "$name: $(grep -E '(passed|failed|error)' "$LOG/$name.log" | tail -n 1)"
done
if [ -f "$LOG/bench.json" ]; then
  "$PY" - "$LOG/bench.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
targets = {(64, 60): (0.15e-3, None), (1024, 101): (1e-3, None), (4096, 217): (3e-3, 100 * 2**20)}
print("\n| B, n, d | fwd ms | bwd ms | fwd+bwd ms | target ms | extra MB | pair-rank/s (fwd+bwd) | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    f = r["fused"]
    limit, memory_limit = targets.get((r["B"], r["n"]), (None, None))
    ok = (limit is None or f["both"] <= limit) and (memory_limit is None or f["memory"] <= memory_limit)
    rate = r["B"] * (r["B"] - 1) // 2 * r["n"] / f["both"]
    print(f"| {r['B']}, {r['n']}, {r['d']} | {f['forward']*1e3:.3f} | {f['backward']*1e3:.3f} | {f['both']*1e3:.3f} | "
          f"{'-' if limit is None else f'{limit*1e3:g}'} | {f['memory']/2**20:.1f} | {rate:.3g} | "
          f"{'-' if limit is None else ('PASS' if ok else 'MISS')} |")
EOF
fi
echo "logs: $LOG"
for name in build kernels test_cuda tests bench; do
  [ "${STATUS[$name]:-}" = ok ] || exit 1
done
