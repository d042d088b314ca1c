#!/usr/bin/env bash
# Run every benchmark and collect the JSON outputs in one folder.
#
#   benchmarks/run_all.sh [OUT_DIR] [extra flags for every script...]
#
#   OUT_DIR            default benchmarks/results/<timestamp>
#   PYTHON=...         interpreter (default: .venv/bin/python if present, else python)
#   QUICK=1            tiny settings (checks that everything runs; seconds, not measurements)
#   PRESETS="..."      sizes for rollout/update/mfu (default: "tiny demo" on CPU,
#                      "demo minimind-3 minimind-3-moe" on a GPU)
#   STEPS=N            optimizer steps of the step breakdown (default 6)
#
# Device: each script auto-detects (CUDA if available); pass --device cpu to force the CPU.
# Measure on a quiet machine: other processes on the cores skew every figure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cd "$repo"

out="${1:-benchmarks/results/$(date +%Y%m%d-%H%M%S)}"
shift || true
extra=("$@")

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export TRL_EXPERIMENTAL_SILENCE=1

gpu="$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))')"
for arg in "${extra[@]}"; do
  if [[ "$arg" == "cpu" || "$arg" == "--device=cpu" ]]; then gpu=0; fi
done
if [[ -z "${PRESETS:-}" ]]; then
  if [[ "$gpu" == "1" ]]; then PRESETS="demo minimind-3 minimind-3-moe"; else PRESETS="tiny demo"; fi
fi
quick=()
if [[ "${QUICK:-0}" == "1" ]]; then quick=(--quick); PRESETS="tiny"; fi

mkdir -p "$out"
echo "results -> $out (gpu=$gpu, presets: $PRESETS)"

run() {  # name, then the command; keeps the printed table in NAME.txt
  local name="$1"; shift
  echo; echo "=== $name: $*"
  "$@" 2>&1 | tee "$out/$name.txt"
}

for preset in $PRESETS; do
  run "rollout_$preset" "$PYTHON" benchmarks/rollout.py --preset "$preset" --output "$out/rollout_$preset.json" \
    "${quick[@]}" "${extra[@]}"
  run "update_$preset" "$PYTHON" benchmarks/update.py --preset "$preset" --output "$out/update_$preset.json" \
    "${quick[@]}" "${extra[@]}"
  run "mfu_$preset" "$PYTHON" benchmarks/mfu.py --preset "$preset" --update-json "$out/update_$preset.json" \
    --rollout-json "$out/rollout_$preset.json" --output "$out/mfu_$preset.json" "${quick[@]}" "${extra[@]}"
done

run policy_pass "$PYTHON" benchmarks/policy_pass.py --output "$out/policy_pass.json" "${quick[@]}" "${extra[@]}"

sb_extra=()  # the step breakdown has no --dtype: the recipe sets it
skip=0
for arg in "${extra[@]}"; do
  if [[ "$skip" == "1" ]]; then skip=0; continue; fi
  case "$arg" in
    --dtype) skip=1 ;;
    --dtype=*) ;;
    *) sb_extra+=("$arg") ;;
  esac
done
run step_breakdown "$PYTHON" benchmarks/step_breakdown.py --steps "${STEPS:-6}" --output "$out/step_breakdown.json" \
  "${quick[@]}" "${sb_extra[@]}"

echo; echo "=== targets"
"$PYTHON" - "$out" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    data = json.loads(path.read_text())
    for t in data.get("targets", []):
        mark = "n/a" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        print(f"[{mark}] {path.stem}: {t['name']}: {t['measured']} (target {t['target']})")
EOF
