#!/usr/bin/env bash
# One prepared check of a CUDA machine, in one run of under 10 minutes on one H100 with no
# network: the `gpu` tests, then one JSON line per benchmark (bench/gpu_check.py: evaluation of
# one TOFU model, EAP-IG scores of 20 QA, one unlearning epoch; bench/memory_plan.py's ratios
# where that benchmark is present). Needs a CUDA torch and the project installed beforehand
# (wheels: `pip install --no-index --find-links WHEELS unlearn-plugins[test]`), TOFU's files in
# UNLEARN_TOFU_DIR, and the embedded model's GGUF (shipped in the package).
#
#   UNLEARN_TOFU_DIR=DIR bash bench/gpu_check.sh            # on the GPU machine
#   UNLEARN_TOFU_DIR=DIR bash bench/gpu_check.sh --dry-run  # anywhere: tiny model, tiny sizes, CPU
#
# Each step's output goes to stderr; the JSON lines to stdout. Exit status: the first failure.
set -u -o pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
DRY=""
if [ "${1:-}" = "--dry-run" ]; then DRY="--dry-run"; fi
: "${UNLEARN_TOFU_DIR:?set UNLEARN_TOFU_DIR to the folder of the TOFU JSON files}"
status=0
started=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - started )) s)" >&2; }

step "environment"
"$PYTHON" - <<'PY' || status=$?
import json, platform, torch
cuda = torch.cuda.is_available()
print(json.dumps({"benchmark": "environment", "python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "gpus": torch.cuda.device_count() if cuda else 0,
                  "gpu": torch.cuda.get_device_name() if cuda else None}), flush=True)
PY

step "pytest -m gpu"
# --dry-run: the gpu tests only report why they skip (no CUDA here)
"$PYTHON" -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_gpu.py >&2
code=$?
if [ $code -ne 0 ] && [ $code -ne 5 ]; then status=$code; fi

step "benchmarks"
"$PYTHON" bench/gpu_check.py $DRY --tofu-dir "$UNLEARN_TOFU_DIR" || { code=$?; [ $status -eq 0 ] && status=$code; }

if [ -f bench/memory_plan.py ]; then
  step "memory plan"
  if [ -n "$DRY" ]; then
    step "memory plan: its --gpu figures need a GPU; skipped by --dry-run"
  else
    "$PYTHON" bench/memory_plan.py --gpu || { code=$?; [ $status -eq 0 ] && status=$code; }
  fi
else
  step "memory plan: bench/memory_plan.py is not in this checkout; skipped"
fi

step "done, exit status $status"
exit $status
