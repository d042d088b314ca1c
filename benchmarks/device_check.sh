#!/usr/bin/env bash
# The device check: one call on a GPU machine, one JSON file (see benchmarks/README.md).
#
#   bash benchmarks/device_check.sh [OUTPUT.json] [--quick] [--time-limit S] [--parts a,b,...]
#
#   OUTPUT.json   default $OUT/device_check.json when $OUT is set, else benchmarks/results/device_check.json
#   --quick       tiny presets on the CPU in well under a minute: checks that every part runs
#   PYTHON=...    interpreter (default: .venv/bin/python when it imports torch, else python)
#
# The driver (benchmarks/device_check.py) starts no part after 420 s and interrupts one still
# running at 465 s; `timeout` here is the backstop that keeps the call under 8 minutes.
set -uo pipefail

export DEVICE_CHECK_T0="$(date +%s.%N)"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=python
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c 'import torch' 2>/dev/null; then PYTHON=.venv/bin/python; fi
fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false
export TRANSFORMERS_NO_ADVISORY_WARNINGS=1

if command -v timeout >/dev/null; then
  exec timeout -k 10 "${DEVICE_CHECK_TIMEOUT:-470}" "$PYTHON" benchmarks/device_check.py "$@"
fi
exec "$PYTHON" benchmarks/device_check.py "$@"
