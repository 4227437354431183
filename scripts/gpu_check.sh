#!/usr/bin/env bash
# The GPU check, on one GPU (an H200) in at most 8 minutes: tests/gpu, the Triton tests run natively (no
# interpreter), a quick GPU benchmark grid (attention math and a training step), and the training check of
# scripts/gpu_train_check.py. Every step has a time budget; a failing step is recorded and the next one runs.
# The figures go to a folder it prints (default docs/gpu/<UTC date>), ready to commit.
#
# The lead's command, from the repository root of the checkout the device tool sends:
#   once, here:   echo /.whl/ >> .git/info/exclude
#                 python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#                     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#                     open_clip_torch==3.3.0 ftfy==6.3.1 wcwidth==0.9.4 webdataset==1.0.2 braceexpand==0.1.7 timm==1.0.31
#   on the GPU:   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=560)
#   then, here:   tar xzf <files_at>/gpu_check.tar.gz -C docs/gpu && git add docs/gpu/<date>
# The GPU machine has torch, triton, accelerate, pandas, matplotlib, safetensors, PyYAML but not open_clip or
# webdataset (models/ and the data pipeline import them): the wheels above travel in .whl and are installed into
# /tmp/site, first on PYTHONPATH after the repository.
#
# Usage: scripts/gpu_check.sh [--rehearse | --dry-run] [DIR]
#   --rehearse  the same steps on this machine's CPU with tiny grids: checks the wheels, the paths, the test
#               selection and the packaging without a GPU (the GPU tests skip there, saying why)
#   --dry-run   prints each step's command and budget, runs nothing
# Environment: PYTHON (default python3), WHEELS (default .whl), OUT (set by the device tool: the folder whose
# files come back; gpu_check.tar.gz and summary.md are left there).
set -u
cd "$(dirname "$0")/.."
MODE=gpu
case "${1:-}" in
  --rehearse) MODE=rehearse; shift ;;
  --dry-run) MODE=dry; shift ;;
esac
DIR=${1:-docs/gpu/$(date -u +%Y-%m-%d)}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SUMMARY="$DIR/summary.md"
FAILED=0
START=$(date +%s)

if compgen -G "$WHEELS/*.whl" >/dev/null && [ "$MODE" != dry ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "error: installing the wheels in $WHEELS failed" >&2; exit 1; }
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
unset TRITON_INTERPRET  # the Triton tests run compiled kernels here; on the CPU their own conftest sets it

if [ "$MODE" != dry ]; then
  mkdir -p "$DIR/logs"
  printf '# GPU check %s\n\n%s mode, started %s UTC, folder %s\n\n| step | exit | seconds | log |\n|---|---|---|---|\n' \
    "$(date -u +%Y-%m-%d)" "$MODE" "$(date -u +%H:%M)" "$DIR" >"$SUMMARY"
fi

# step NAME BUDGET_SECONDS COMMAND...: runs the command under `timeout`, logs it, records exit code and time
step() {
  local name=$1 budget=$2 t0 rc
  shift 2
  if [ "$MODE" = dry ]; then
    echo "[$name, at most ${budget}s] $*"
    return
  fi
  echo "=== $name (at most ${budget}s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$budget" "$@" >"$DIR/logs/$name.txt" 2>&1
  rc=$?
  tail -n 15 "$DIR/logs/$name.txt"
  [ "$rc" -ne 0 ] && FAILED=1
  echo "| $name | $rc$([ "$rc" -eq 124 ] && echo ' (out of time)') | $(($(date +%s) - t0)) | logs/$name.txt |" >>"$SUMMARY"
}

shopt -s nullglob
TRITON_TESTS=(tests/models/test_triton*.py)
if [ "$MODE" = rehearse ]; then
  DEVICE=cpu
  ATTENTION_GRID=(--quick --variants softmax linear_affine_nodenom --long-sizes)
  TRAIN_GRID=(--sizes tiny-s --attention-size tiny-s --resolutions 64 --attentions linear_affine --steps 1)
  LONG_GRID=(--size tiny-s --image-sizes 32,64 --text-lengths 16,48 --clip 32,16 --steps 1 --threads 2)
  TESTS=(tests/gpu)  # the Triton tests under the interpreter take minutes here: collected, not run
  TRAIN_CHECK=(--device cpu --model tiny-s --sharded-model tiny-s --steps 2 --batch 4 --sharded-batch 4 --timeout 80)
  [ ${#TRITON_TESTS[@]} -gt 0 ] && step triton_collect 120 "$PY" -m pytest -q --collect-only -p no:cacheprovider "${TRITON_TESTS[@]}"
else
  DEVICE=cuda
  ATTENTION_GRID=(--sizes 77 197 4096 65536 1048576 4000000 --dtypes bfloat16 --budget 0.2 --max-seconds 2 --total-minutes 1.4)
  TRAIN_GRID=(--sizes ViT-B-16 --steps 2 --resolutions 224,448,896)
  LONG_GRID=(--size ViT-S-16 --image-sizes 224,448,1024,2048 --text-lengths 77,248,1024,4096 --clip 1024,248
             --block-above 100000 --steps 3)  # every length measured whole on the GPU, none extrapolated
  TESTS=(tests/gpu "${TRITON_TESTS[@]}")
  TRAIN_CHECK=(--timeout 80)
fi

step environment 40 bash -c "nvidia-smi || true; $PY -c '$(cat <<'PYTHON'
import importlib, sys, torch
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())
for name in ("triton", "open_clip", "webdataset", "timm", "accelerate"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as err:
        print(name, "missing:", err)
PYTHON
)'"
step tests 160 "$PY" -m pytest -q -ra -p no:cacheprovider "${TESTS[@]}"
step bench_attention 120 "$PY" -m scripts.bench_attention --device "$DEVICE" "${ATTENTION_GRID[@]}" --out "$DIR/bench_attention_$DEVICE"
step bench_long 120 "$PY" -m scripts.bench_long --device "$DEVICE" --bf16 "${LONG_GRID[@]}" --out "$DIR/bench_long_$DEVICE"
step bench_train 60 "$PY" -m scripts.bench_train --device "$DEVICE" "${TRAIN_GRID[@]}" --out "$DIR"
# ---- the training check (scripts/gpu_train_check.py: 20 steps of ViT-B-16 bf16 on one GPU, FSDP with two) ----
if [ -f scripts/gpu_train_check.py ]; then
  step gpu_train_check 90 "$PY" -m scripts.gpu_train_check "${TRAIN_CHECK[@]}" --out "$DIR/train_check"
elif [ "$MODE" != dry ]; then
  echo "| gpu_train_check | skipped: scripts/gpu_train_check.py is not in this checkout | 0 | |" >>"$SUMMARY"
fi
# ---- end of the training check ----

[ "$MODE" = dry ] && exit 0
printf '\nTotal %s s; figures in %s\n' "$(($(date +%s) - START))" "$DIR" >>"$SUMMARY"
cat "$SUMMARY"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/gpu_check.tar.gz" -C "$(dirname "$DIR")" "$(basename "$DIR")" && cp "$SUMMARY" "$OUT/summary.md"
fi
echo "figures: $DIR"
exit $FAILED
