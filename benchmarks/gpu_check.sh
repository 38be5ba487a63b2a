#!/usr/bin/env bash
# GPU check of sol_ext: build the CUDA kernels for the visible GPU, run the CUDA tests and a differential
# fuzz of the CUDA ops (benchmarks/fuzz_kernels.py), benchmark StochasticOrderLoss against the vectorized
# reference (with a torch.profiler breakdown; with check_values=False also replayed from a CUDA graph and
# through torch.compile(mode="reduce-overhead")), time the grouped and pairwise algorithms on a grid of
# sizes, run the suite's CUDA cases, the image throughput benchmark and the driver on the GPU (float32 and
# --amp), and print a short summary table last. About 9 minutes on one H200 with 16 cores; the steps that
# would pass BUDGET_S are skipped, so the most wanted come first.
#
#   bash benchmarks/gpu_check.sh              # from the repository root (any cwd works)
#
# Environment:
#   PYTHON         interpreter (default python3)
#   OUT            folder for logs, bench JSON and the built extension (default $TMPDIR/sol_ext_gpu_check)
#   WHEELS         folder of wheels for missing test dependencies (default .gpu_wheels; pip download
#                  --python-version 3.12 --only-binary=:all: numpy matplotlib tqdm pillow coral-pytorch ...,
#                  and torchvision matching the machine's torch with --no-deps)
#   BUDGET_S       wall-clock seconds for the whole check (default 500): later steps get what is left
#   TORCH_CUDA_ARCH_LIST (default: the visible GPU's compute capability), MAX_JOBS (default nproc),
#   BENCH_SIZES    B,n,d triples (default: the three performance targets)
#   ALGORITHM_SIZES  B,n,d triples of the grouped-vs-pairwise step (default: B 1024-16384 x n 5-60, then
#                  65536,7 and 1000000,5; d 64)
#   FUZZ_CONFIGS   random configurations of the differential fuzz (default 10000), run in FUZZ_SHARDS
#                  processes side by side (default 6); FUZZ_ONE_PASS more with the all-pairs backward forced
#                  to its one-pass kernel (default 1000; 0 skips them); FUZZ_FUSED_CENTROIDS of the first
#                  again with SOL_EXT_CUDA_DISSIMILARITY=fused (default 1000; 0 skips them)
#   PYTEST_ARGS    arguments of the suite step (default "-k cuda": its CUDA cases; "" for all of it)
#   SWEEP          VAR=value settings to time SWEEP_SIZES under, one bench_loss.py run each, beside
#                  bench_unchecked's default (default: SOL_EXT_CUDA_DISSIMILARITY=fused, the dissimilarity's
#                  fused centroid side; SOL_EXT_CUDA_ALL_PAIRS_BACKWARD=two_pass / =one_pass force the all-pairs
#                  backward's kernels, SOL_EXT_CUDA_BACKWARD_WARPS=2048 tunes the two-pass kernel's grid; ""
#                  skips the step)
#   IMAGES, IMAGE_WORKERS  images and DataLoader processes of the image throughput benchmark (default 1000, 8)
#   SKIP           names of steps to leave out, e.g. "driver driver_amp"
# Needs no network. A prebuilt sol_ext/_C*.so for this interpreter (e.g. $OUT/_C*.so of an earlier run,
# copied back) skips the build.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the benchmark imports sol_ext from this folder too
LOG=${OUT:-${TMPDIR:-/tmp}/sol_ext_gpu_check}
BUDGET_S=${BUDGET_S:-500}
STEPS=(deps build kernels test_cuda bench bench_unchecked bench_algorithms sweep fuzz driver bench_images tests driver_amp)
mkdir -p "$LOG"
declare -A STATUS SECONDS_TAKEN

run_step() {  # name, timeout seconds (capped by what is left of BUDGET_S), command...
  local name=$1 limit=$2
  shift 2
  if [[ " ${SKIP:-} " == *" $name "* ]]; then
    STATUS[$name]="skipped (SKIP)"
    return 0
  fi
  local left=$((BUDGET_S - SECONDS - 15))  # keep 15 s for the summary
  if [ "$left" -lt 20 ]; then
    STATUS[$name]="skipped (budget spent)"
    echo "=== $name: skipped, $left s of the budget left" | tee -a "$LOG/summary.log"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (limit ${limit} s): $*" | tee -a "$LOG/summary.log"
  local start=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
  local rc=$?
  SECONDS_TAKEN[$name]=$((SECONDS - start))
  STATUS[$name]=$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc=$rc)")
  echo "=== $name: ${STATUS[$name]} in ${SECONDS_TAKEN[$name]} s" | tee -a "$LOG/summary.log"
  return $rc
}

summary() {
  echo
  echo "## sol_ext GPU check ($(head -n 2 "$LOG/gpu.txt" | tail -n 1))"
  echo
  echo "| step | status | seconds |"
  echo "| --- | --- | --- |"
  for name in "${STEPS[@]}"; do
    echo "| $name | ${STATUS[$name]:-not run} | ${SECONDS_TAKEN[$name]:-} |"
  done
  for name in test_cuda tests; do
    [ -f "$LOG/$name.log" ] && echo "$name: $(grep -E '(passed|failed|error)' "$LOG/$name.log" | tail -n 1)"
  done
  for run in run-fp32 run-amp; do
    [ -f "$LOG/$run/results.json" ] && "$PY" -c "
import json, sys; r = json.load(open(sys.argv[1])); t = r['test']
print(f\"{sys.argv[2]}: test MAE {t['mae']:.4f}, CS {t['cs']:.2f}, Pearson {t['pearson']:.4f}; \"
      f\"epoch {r['selected_epoch']} of {r['epochs_run']}, {r['seconds']:.1f} s\")" \
      "$LOG/$run/results.json" "$run"
  done
  [ -f "$LOG/fuzz.log" ] && grep -E '^(fuzz|\||mismatches|one-pass|tracing|config)' "$LOG/fuzz.log"
  [ -f "$LOG/sweep.log" ] && grep '^sweep' "$LOG/sweep.log"
  [ -f "$LOG/bench_algorithms.log" ] && grep -E "^\\| cuda" "$LOG/bench_algorithms.log"
  [ -f "$LOG/bench_images.log" ] && grep -E '^(resnet|\||target)' "$LOG/bench_images.log"
  for json_file in "$LOG/bench.json" "$LOG/bench-unchecked.json"; do
    [ -f "$json_file" ] || continue
    "$PY" - "$json_file" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"\n{sys.argv[1].rsplit('/', 1)[-1]}: StochasticOrderLoss(check_values={rows[0].get('check_values', True)})")
targets = {(64, 60): (0.15e-3, None), (1024, 101): (1e-3, None), (4096, 217): (3e-3, 100 * 2**20)}
print("\n| B, n, d | fwd ms | bwd ms | fwd+bwd ms | fwd+bwd in a CUDA graph ms | fwd+bwd compiled (reduce-overhead) ms |"
      " target ms | extra MB | ref fwd+bwd ms | ref extra MB | speed-up | pair-rank/s | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    f, ref = r["fused"], r["reference"]
    limit, memory_limit = targets.get((r["B"], r["n"]), (None, None))
    ok = (limit is None or f["both"] <= limit) and (memory_limit is None or f["memory"] <= memory_limit)
    rate = r["B"] * (r["B"] - 1) // 2 * r["n"] / f["both"]
    ref_text = (f"{ref['both']*1e3:.3f} | {ref['memory']/2**20:.0f} | {ref['both']/f['both']:.0f}x" if ref
                else "does not fit | - | -")
    graph, compiled = ("-" if f.get(k) is None else f"{f[k]*1e3:.3f}" for k in ("graph", "compiled"))
    print(f"| {r['B']}, {r['n']}, {r['d']} | {f['forward']*1e3:.3f} | {f['backward']*1e3:.3f} | {f['both']*1e3:.3f} | "
          f"{graph} | {compiled} | "
          f"{'-' if limit is None else f'{limit*1e3:g}'} | {f['memory']/2**20:.1f} | {ref_text} | {rate:.3g} | "
          f"{'-' if limit is None else ('PASS' if ok else 'MISS')} |")
EOF
  done
  echo "logs: $LOG"
}
trap summary EXIT

# --- environment: what is missing comes first --------------------------------------------------------
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv | tee "$LOG/gpu.txt"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' ')
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch}
export CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared"  # exceptions must not crash
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export SOL_EXT_FORCE_CUDA=1
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS BUDGET_S=$BUDGET_S"

missing_modules() {
  "$PY" - <<'EOF'
import importlib.util
need = {"numpy": "numpy", "matplotlib": "matplotlib", "tqdm": "tqdm", "PIL": "pillow", "coral_pytorch": "coral-pytorch",
        "pytest": "pytest", "setuptools": "setuptools", "ninja": "ninja", "torchvision": "torchvision"}
print(" ".join(pkg for module, pkg in need.items() if importlib.util.find_spec(module) is None))
EOF
}
deps() {
  local missing
  missing=$(missing_modules)
  echo "missing before: ${missing:-nothing}"
  if [ -n "$missing" ] && [ -d "$WHEELS" ]; then
    # torchvision pins one torch: --no-deps keeps the machine's (its wheel must match it, e.g.
    # torchvision 0.26 for torch 2.11)
    [[ " $missing " == *" torchvision "* ]] && "$PY" -m pip install -q --no-index --no-deps --find-links "$WHEELS" torchvision
    missing=${missing//torchvision/}
    # shellcheck disable=SC2086
    [ -n "${missing// /}" ] && "$PY" -m pip install -q --no-index --find-links "$WHEELS" $missing
  fi
  missing=$(missing_modules)
  echo "missing after: ${missing:-nothing}"
  command -v ninja >/dev/null || echo "no ninja on PATH: the build compiles one file at a time"
  return 0
}
export PY LOG WHEELS=${WHEELS:-.gpu_wheels}
export -f missing_modules deps
run_step deps 90 bash -c deps  # (timeout runs programs: the function goes through bash -c)

# --- build (in place: the tests and the benchmark import the package from this folder) ---------------
build() {
  local suffix
  suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  if [ -f "sol_ext/_C$suffix" ] && [ -z "${FORCE_BUILD:-}" ]; then
    echo "using the prebuilt sol_ext/_C$suffix"
  else
    "$PY" setup.py build_ext --inplace || return 1
  fi
  cp "sol_ext/_C$suffix" "$LOG/" 2>/dev/null || true
}
export -f build
if ! run_step build 300 bash -c build; then
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

# --- the CUDA-specific tests, then the benchmark: the figures docs/performance.md reports --------------
run_step test_cuda 200 "$PY" -m pytest -q -p no:cacheprovider tests/ops/test_cuda.py
# the fused CUDA ops against the CPU kernels and a float64 oracle on random configurations (docs/performance.md,
# "On a GPU"): FUZZ_CONFIGS split over FUZZ_SHARDS processes side by side (the oracle runs on the CPU) and
# merged into one table; FUZZ_ONE_PASS more configurations (from FUZZ_CONFIGS on) with the all-pairs backward
# forced to its one-pass kernel at every size where its buffer fits
fuzz() {
  local shards=${FUZZ_SHARDS:-6} configs=${FUZZ_CONFIGS:-10000} pids=() files=() status=0
  local per=$(((configs + shards - 1) / shards))
  rm -f "$LOG"/fuzz*.json "$LOG"/fuzz-*.log  # no stale results of an earlier run in the same $OUT
  for ((i = 0; i < shards; i++)); do
    local first=$((i * per)) count=$per
    [ $((first + count)) -gt "$configs" ] && count=$((configs - first))
    [ "$count" -gt 0 ] || continue
    OMP_NUM_THREADS=2 "$PY" benchmarks/fuzz_kernels.py --device cuda --first $first --configs $count \
      --json "$LOG/fuzz-$i.json" >"$LOG/fuzz-$i.log" 2>&1 &
    pids+=($!) files+=("$LOG/fuzz-$i.json")
  done
  if [ "${FUZZ_ONE_PASS:-1000}" -gt 0 ]; then
    SOL_EXT_CUDA_ALL_PAIRS_BACKWARD=one_pass OMP_NUM_THREADS=2 "$PY" benchmarks/fuzz_kernels.py --device cuda \
      --first "$configs" --configs "${FUZZ_ONE_PASS:-1000}" --json "$LOG/fuzz-one-pass.json" >"$LOG/fuzz-one-pass.log" 2>&1 &
    pids+=($!)
  fi
  if [ "${FUZZ_FUSED_CENTROIDS:-1000}" -gt 0 ]; then
    SOL_EXT_CUDA_DISSIMILARITY=fused OMP_NUM_THREADS=2 "$PY" benchmarks/fuzz_kernels.py --device cuda \
      --first 0 --configs "${FUZZ_FUSED_CENTROIDS:-1000}" --json "$LOG/fuzz-fused-centroids.json" \
      >"$LOG/fuzz-fused-centroids.log" 2>&1 &
    pids+=($!)
  fi
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  grep MISMATCH "$LOG"/fuzz-*.log  # each line with the run it came from
  "$PY" benchmarks/fuzz_kernels.py --merge "${files[@]}" --json "$LOG/fuzz.json" || status=1
  local mismatched
  mismatched=$("$PY" -c "
import json, sys
checks = json.load(open(sys.argv[1]))['checks'].values()
print(','.join(sorted({str(i) for c in checks for i in c.get('mismatched_configs', [])}, key=int)[:10]))" "$LOG/fuzz.json")
  if [ -n "$mismatched" ]; then  # each mismatching configuration's worst elements, for tracing
    echo "tracing configurations $mismatched:"
    "$PY" benchmarks/fuzz_kernels.py --device cuda --only "$mismatched" --explain | grep '^config'
  fi
  if [ -f "$LOG/fuzz-one-pass.json" ]; then
    echo "one-pass backward forced (SOL_EXT_CUDA_ALL_PAIRS_BACKWARD=one_pass):"
    "$PY" benchmarks/fuzz_kernels.py --merge "$LOG/fuzz-one-pass.json" | sed 's/^fuzz:/fuzz one_pass:/'
  fi
  if [ -f "$LOG/fuzz-fused-centroids.json" ]; then
    echo "the dissimilarity's fused centroid side (SOL_EXT_CUDA_DISSIMILARITY=fused), the first configurations again:"
    "$PY" benchmarks/fuzz_kernels.py --merge "$LOG/fuzz-fused-centroids.json" | sed 's/^fuzz:/fuzz fused_centroids:/'
    mismatched=$("$PY" -c "
import json, sys
checks = json.load(open(sys.argv[1]))['checks'].values()
print(','.join(sorted({str(i) for c in checks for i in c.get('mismatched_configs', [])}, key=int)[:10]))" \
      "$LOG/fuzz-fused-centroids.json")
    if [ -n "$mismatched" ]; then
      echo "tracing configurations $mismatched (SOL_EXT_CUDA_DISSIMILARITY=fused):"
      SOL_EXT_CUDA_DISSIMILARITY=fused "$PY" benchmarks/fuzz_kernels.py --device cuda --only "$mismatched" --explain |
        grep '^config'
    fi
  fi
  return $status
}
export -f fuzz
SIZES=${BENCH_SIZES:-64,60,512 1024,101,512 4096,217,512}
# shellcheck disable=SC2086
run_step bench 180 "$PY" benchmarks/bench_loss.py --device cuda --min-run-time 0.3 --json "$LOG/bench.json" --profile \
  --sizes $SIZES
# shellcheck disable=SC2086
run_step bench_unchecked 200 "$PY" benchmarks/bench_loss.py --device cuda --min-run-time 0.3 --no-check-values \
  --json "$LOG/bench-unchecked.json" --sizes $SIZES
# grouped (sorting) vs pairwise vs reference on a grid of (B, n): the crossovers of algorithm="auto" on this
# GPU (docs/performance.md, "All pairs by sorting"), grouped with each implementation of its CUDA op
# (SOL_EXT_CUDA_GROUPED=separate, the default, and =fused) and a torch.profiler table of each per size; sizes
# where a pairwise call would take over --budget seconds are skipped
ALGORITHM_SIZES=${ALGORITHM_SIZES:-$(for B in 1024 4096 16384; do for n in 5 20 60; do printf '%s,%s,64 ' $B $n; done; done; echo 65536,7,64 1000000,5,64)}
# shellcheck disable=SC2086
run_step bench_algorithms 200 "$PY" benchmarks/bench_loss.py --algorithms --device cuda --budget 10 --min-run-time 0.2 \
  --profile --json "$LOG/bench-algorithms.json" --sizes $ALGORITHM_SIZES
sweep() {  # settings of the environment (the kernels' alternatives) against bench_unchecked's default
  for setting in $SWEEP; do
    env "$setting" "$PY" benchmarks/bench_loss.py --device cuda --min-run-time 0.3 --no-check-values \
      --json "$LOG/sweep-${setting%%=*}-${setting##*=}.json" --sizes $SWEEP_SIZES >/dev/null || return 1
    "$PY" -c "
import json, sys
for r in json.load(open(sys.argv[1])):
    f = r['fused']
    graph = '-' if f.get('graph') is None else f\"{f['graph']*1e3:.3f} ms\"
    print(f\"sweep {sys.argv[2]:>40}: B={r['B']} n={r['n']}  fwd {f['forward']*1e3:.3f} ms  bwd {f['backward']*1e3:.3f} ms  \"
          f\"fwd+bwd {f['both']*1e3:.3f} ms  graph {graph}  extra {f['memory']/2**20:.1f} MB\")" \
      "$LOG/sweep-${setting%%=*}-${setting##*=}.json" "$setting"
  done
}
export -f sweep
# the fused centroid side of the dissimilarity at the three targets' sizes (bench_unchecked: the default);
# the all-pairs backward's two kernels were last swept on an H100 (benchmarks/results/gpu/h100-backward-*.json)
export SWEEP=${SWEEP-SOL_EXT_CUDA_DISSIMILARITY=fused}
export SWEEP_SIZES=${SWEEP_SIZES:-64,60,512 1024,101,512 4096,217,512}
[ -n "$SWEEP" ] || SKIP="${SKIP:-} sweep"
run_step sweep 150 bash -c sweep
run_step fuzz 240 bash -c fuzz
# the default training (abalone, 20 epochs) in float32 and mixed precision (float16 + GradScaler);
# compare with `sol-ext train --device cpu --seed 0|1|2` of the same configuration
run_step driver 120 "$PY" -m sol_ext.driver train --device cuda --no-plots --output "$LOG/run-fp32" --overwrite
# image training throughput: SOL's epoch against l1's, resnet18 at 224 px, batch 64, AMP (docs/images.md)
run_step bench_images 180 "$PY" benchmarks/bench_images.py --device cuda --image-size 224 --batch-size 64 --amp \
  --images "${IMAGES:-1000}" --workers "${IMAGE_WORKERS:-8}" --json "$LOG/bench-images.json"
# the rest of the suite on the GPU, the benchmarks' smoke tests too: its CUDA cases by default (PYTEST_ARGS="" for all)
# shellcheck disable=SC2086
run_step tests 300 "$PY" -m pytest -q -p no:cacheprovider tests benchmarks --ignore=tests/ops/test_cuda.py ${PYTEST_ARGS--k cuda}
run_step driver_amp 120 "$PY" -m sol_ext.driver train --device cuda --amp --no-plots --output "$LOG/run-amp" --overwrite

for name in "${STEPS[@]}"; do
  case "${STATUS[$name]:-}" in
    ok | "skipped (SKIP)") ;;
    *) exit 1 ;;
  esac
done
