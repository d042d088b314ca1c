#!/usr/bin/env bash
# N real processes on a GPU-less host (gloo). Usage:
#   bash scripts/launch_cpu_multi.sh [--num_processes N] -m minimind_trl.cli train RECIPE --output-dir DIR
# accelerate's multi-process launcher does not pass "use_cpu" to the ranks, so set it here; without
# it every rank believes it is rank 0 of 1.
set -euo pipefail
cd "$(dirname "$0")/.."
export ACCELERATE_USE_CPU=true
exec .venv/bin/accelerate launch --config_file accelerate_configs/cpu_multi.yaml "$@"
