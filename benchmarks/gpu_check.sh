#!/usr/bin/env bash
# The GPU path as a user runs it, on a machine with an NVIDIA GPU and onnxruntime-gpu, in a few minutes:
# doctor, export --target gpu, optimize fp16, verify --device gpu (exact fp32, and TF32 judged as tf32),
# run on real photos against the CPU, bench at several batch sizes, deploy serve under perf_analyzer
# (benchmarks/gpu_serving.py: four front ends, tensors in system shared memory, HTTP), the GPU tests
# (CUDA shared memory, CUDA graphs), and the engine variants of benchmarks/gpu.py. Writes one
# markdown report. The steps that check results run side by side (the table says which); what is
# timed runs alone.
#
#   benchmarks/gpu_check.sh MODEL PHOTOS.npz [OUT_DIR]
#
# MODEL: an ONNX file or any source `deploy export` takes, with a dynamic batch dimension and one
# input 'x' (docs/gpu.md shows how to write EfficientNet-Lite0 and real photos with the zoo's packages).
# PHOTOS.npz: real inputs under 'x' (calibration for fp16, and the photos `deploy run` classifies).
# `deploy` is taken from PATH, else `python3 -m unideploy.cli.main`. Steps that fail are recorded,
# not fatal: the report says what failed and why.
set -uo pipefail
MODEL=${1:?usage: gpu_check.sh MODEL PHOTOS.npz [OUT_DIR]}
PHOTOS=${2:?usage: gpu_check.sh MODEL PHOTOS.npz [OUT_DIR]}
OUT=${3:-gpu-check}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
REPORT="$OUT/gpu-check.md"
PKG="$OUT/model.udp"
if command -v deploy >/dev/null; then DEPLOY=(deploy); else DEPLOY=("$PY" -m unideploy.cli.main); fi

step() {  # step NAME COMMAND...: run it, keep its output in OUT/NAME.log and its report line in OUT/NAME.row
  local name=$1; shift
  local start end rc
  start=$(date +%s.%N)
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  local last result
  last=$(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-200 | tr '|' '/')
  if [ $rc != 0 ]; then
    result="FAILED ($rc): $last"
  elif [[ $last =~ ^[0-9]+\ skipped\ in ]]; then  # pytest passes when every test skipped: say so, and why
    result="skipped: $(grep -m1 '^SKIPPED' "$OUT/$name.log" | sed 's/^SKIPPED \[[0-9]*\] [^ ]*: //' | cut -c1-200 | tr '|' '/')"
  elif [[ $last =~ ^benchmarks/[a-z_]+\.py:\ skipped,\ (.*)$ ]]; then  # a benchmark with nothing to run here
    result="skipped: ${BASH_REMATCH[1]}"
  else
    result=ok
  fi
  printf '| %s | %s | %s | %.1f |\n' "$name" "$result" "${GROUP:-alone}" "$(awk "BEGIN {print $end - $start}")" >"$OUT/$name.row"
  return $rc
}
rows() {  # the report lines of the steps named, in that order
  local name
  for name in "$@"; do cat "$OUT/$name.row" >>"$REPORT" 2>/dev/null || echo "| $name | did not run | | |" >>"$REPORT"; done
}

{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "Machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'), $(nproc) cores"
  echo "onnxruntime $("$PY" -c 'import onnxruntime as o; print(o.__version__, o.get_available_providers())' 2>&1)"
  echo
  echo "Steps checking results run side by side in groups (their seconds overlap); the timed ones alone."
  echo
  echo "| step | result | ran | seconds |"
  echo "|---|---|---|---:|"
} >"$REPORT"

rm -rf "$PKG" "$OUT/gpu-work"
# doctor beside export; then what needs only the package (the fp16 artifact, the GPU tests: CUDA shared
# memory with tritonclient's own CUDA utilities, and buckets replaying CUDA graphs; gpu.py's encoder
# built on the CPU) side by side; then
# what checks the finished package side by side. Timing nothing, these share the machine: the steps
# took 98 s one after the other (2026-11-28), the check 3 min 55 s against issue 42's 3 minutes;
# side by side that evening: the steps 68 s, the check 2 min 20 s.
PART=$SECONDS
GROUP="beside export" step doctor "${DEPLOY[@]}" doctor --json &
step export "${DEPLOY[@]}" export "$MODEL" -o "$PKG" --target gpu
wait
GROUP="side by side (2)"
step optimize-fp16 "${DEPLOY[@]}" optimize "$PKG" --quantize fp16 --calibration "$PHOTOS" &
step gpu-tests "$PY" -m pytest -q -p no:cacheprovider "$HERE/../tests/server/test_cuda_shared_memory.py" "$HERE/../tests/gpu/test_cuda_graphs.py" \
  "$HERE/../tests/runtimes/test_device_batches.py::test_rows_copied_in_gpu_memory_arrive_whole" &
step prepare-encoder "$PY" "$HERE/gpu.py" --work "$OUT/gpu-work" --prepare &
wait
GROUP="side by side (3)"
step verify-gpu "${DEPLOY[@]}" verify "$PKG" --device gpu --json &
step verify-gpu-tf32 "${DEPLOY[@]}" verify "$PKG" --device gpu --tf32 --json &
step run-gpu "${DEPLOY[@]}" run "$PKG" --input "$PHOTOS" --device gpu --json -o "$OUT/gpu.npz" &
step run-cpu "${DEPLOY[@]}" run "$PKG" --input "$PHOTOS" --device cpu -o "$OUT/cpu.npz" &
wait
CHECKED=$((SECONDS - PART))
unset GROUP
# timed, one at a time: each batch size on one session (a process each cost ~5 s to start)
step bench-gpu "${DEPLOY[@]}" bench "$PKG" --device gpu --batch-size 1,8,32,256 --iterations 50 --json
step bench-fp16-b32 "${DEPLOY[@]}" bench "$PKG" --artifact onnx-fp16 --device gpu --batch-size 32 --iterations 50 --json
step bench-cpu-b32 "${DEPLOY[@]}" bench "$PKG" --device cpu --batch-size 32 --iterations 20 --json
rows doctor export optimize-fp16 gpu-tests prepare-encoder verify-gpu verify-gpu-tf32 run-gpu run-cpu \
  bench-gpu bench-fp16-b32 bench-cpu-b32
echo -e "\nThe checking steps took $CHECKED s side by side, the steps $SECONDS s in all." >>"$REPORT"

# What each step reported: the GPU finding, each artifact's verification, the run, the benchmarks.
"$PY" - "$OUT" >>"$REPORT" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
import numpy as np

out = Path(sys.argv[1])

def load(name):
    try:
        text = (out / f"{name}.log").read_text()
        return json.JSONDecoder().raw_decode(text[text.index("{"):])[0]  # stderr's error line may follow
    except (OSError, ValueError):
        return None

doctor = load("doctor")
if doctor:
    gpu = next((f for f in doctor["findings"] if f["kind"] == "device"), None)
    print(f"\ndoctor, gpu: {'ok' if gpu and gpu['ok'] else 'unavailable'}: {gpu and gpu['detail']}")
for name in ("verify-gpu", "verify-gpu-tf32"):
    found = load(name)
    if not found:
        continue
    print(f"\n{name}:\n\n| artifact | status | ran on | precision | max abs err | tolerance | reason |\n|---|---|---|---|---:|---|---|")
    for a in found["artifacts"]:
        ran, rec = a.get("ran") or {}, a.get("validation") or {}
        err = max((o["max_abs_error"] for o in rec.get("outputs", {}).values()), default="")
        own = ", ".join(f"{k}: {v:.3g}" for k, v in rec.get("output_atol", {}).items())
        tol = f"atol {rec['atol']:.3g}{f' ({own})' if own else ''}, rtol {rec['rtol']:.3g}" if rec else ""
        print(f"| {a['artifact']} | {a['status']} | {', '.join(ran.get('providers', []))} | {ran.get('precision', '')} | {err if err == '' else f'{err:.3g}'} | {tol} | {(a.get('reason') or '')[:160]} |")
run = load("run-gpu")
try:
    gpu, cpu = np.load(out / "gpu.npz"), np.load(out / "cpu.npz")
    key = next(iter(gpu.files))
    agree = int((gpu[key].argmax(-1) == cpu[key].argmax(-1)).sum())
    print(f"\nrun --device gpu: {run and run['artifact']} on {run and ', '.join(run.get('providers', []))}, "
          f"{run and run['precision']}; top-1 {agree}/{len(gpu[key])} photos as on the CPU, max |diff| {np.abs(gpu[key] - cpu[key]).max():.3g}"
          + (f"; passed over: {run['passed_over']}" if run and run.get("passed_over") else ""))
except (OSError, StopIteration, KeyError) as exc:
    print(f"\nrun: no comparison ({exc})")
print("\n| bench | artifact | ran on | precision | batch | p50 ms | p99 ms | images/s | passed over |\n|---|---|---|---|---:|---:|---:|---:|---|")
for name in ("bench-gpu", "bench-fp16-b32", "bench-cpu-b32"):
    b = load(name)
    for run in (b.get("runs", [b]) if b else ()):  # a sweep's batch sizes, one row each
        lat = run["latency_ms"]
        print(f"| {name} | {b['artifact']} | {', '.join(b.get('providers', []))} | {b['precision']} | {run['batch_size']} | {lat['p50']:.2f} | {lat['p99']:.2f} | {run['throughput_per_s']:.0f} | {'; '.join(b.get('passed_over', []))[:160]} |")
EOF

echo -e "\n## deploy serve under perf_analyzer (server on half the cores, perf_analyzer on the other half)\n" >>"$REPORT"
PART=$SECONDS
# perf_analyzer's windows of 1 s (2 s by default): at a GPU's thousands of requests/s each holds
# thousands, and the serving part was about half of the 4 min 43 s the check took (issue 42: < 3 min)
# the default policy over HTTP (the better protocol): gRPC's rows and the other policies (CUDA graphs, ...)
# are studies, run by name with gpu_serving.py alone (docs/gpu.md), so that this check stays short
"$PY" "$HERE/gpu_serving.py" --package "$PKG" --seconds 1 --only "buckets, 4 front ends, shm" --protocol http >>"$REPORT" 2>"$OUT/gpu_serving.log" || echo "gpu_serving.py FAILED: $(tail -3 "$OUT/gpu_serving.log")" >>"$REPORT"
echo -e "\n($((SECONDS - PART)) s)\n\n## Engines in process (benchmarks/gpu.py)\n" >>"$REPORT"
PART=$SECONDS
"$PY" "$HERE/gpu.py" --package "$PKG" --photos "$PHOTOS" --only cnn --only encoder --quick --work "$OUT/gpu-work" --markdown >>"$REPORT" 2>"$OUT/gpu_bench.log" || echo "gpu.py FAILED: $(tail -3 "$OUT/gpu_bench.log")" >>"$REPORT"
# --quick: the engines the targets compare (as deploy runs each artifact, the fused encoder, PyTorch);
# gpu.py's CUDA-option studies, shape changes, page-locked batches and batch threads are recorded in
# docs/gpu.md and run with gpu.py alone (--only shapes|pinned|threads|memory; the one-process server with
# gpu_serving.py --only buckets). The check took 4 min 11 s without serving on 2026-11-27, gpu.py 172 s of it.
# where the check's time went, so that it can be kept short (its steps' seconds are in the table above)
echo -e "\n($((SECONDS - PART)) s)\n\ngpu_check.sh took $((SECONDS / 60)) min $((SECONDS % 60)) s in all." >>"$REPORT"
cat "$REPORT"
