"""benchmarks/device_check.sh --quick runs every part on the CPU and writes one JSON file.

Not a measurement: it checks that the one-call device script is ready to run (every section gets
a value or a recorded reason, the bf16 update-0 ratio is exactly 0) and that its time guard skips
the parts it has no time for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "device_check.sh"
SECTIONS = {"environment", "bf16_update0", "attention", "grpo_64m", "rollout", "update", "policy_pass", "mfu",
            "engines", "zero3_ranks"}
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="no benchmarks/device_check.sh")


def run(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "out.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHON": sys.executable,
           "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(SCRIPT), "--quick", str(out), *flags], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Device check" in done.stdout  # the summary table
    return json.loads(out.read_text(encoding="utf-8"))


def test_quick_device_check_fills_every_section(tmp_path):
    report = run(tmp_path)
    sections = report["sections"]
    assert set(sections) == SECTIONS and report["quick"] is True and report["device"] == "cpu"
    for name, section in sections.items():
        assert section["status"] != "error", (name, section.get("reason"), section.get("traceback"))
        assert section["status"] == "ok" and section.get("value") is not None or section.get("reason"), name
    assert report["complete"] is True

    bf16 = sections["bf16_update0"]["value"]
    for sharing in ("true", "false"):
        run_info = bf16[f"prefix_sharing_{sharing}"]
        assert run_info["trainer"]["mixed_precision"] == "bf16" and run_info["trainer"]["bf16"] is True
        assert run_info["trainer"]["prefix_sharing"] is (sharing == "true")
        assert run_info["update0_max_abs_log_ratio"] == 0.0
        assert [r["update"] for r in run_info["records"]] == [0, 1]  # K=2, 2 steps: one rollout

    attention = sections["attention"]
    assert attention["status"] in ("ok", "not installed")
    assert 0 < attention["value"]["sdpa_bf16_vs_sdpa_fp32_max_abs"] < 1  # bf16 rounding, not a broken model
    grpo = sections["grpo_64m"]["value"]
    assert grpo["update0_max_abs_log_ratio"] == 0.0 and grpo["steps"] and all(s["measured"] > 0 for s in grpo["steps"])
    assert set(sections["rollout"]["value"]) == set(sections["update"]["value"]) == {"tiny", "tiny-moe"}
    assert all(m["update"]["mfu"] > 0 and m["rollout"]["mfu"] > 0 for m in sections["mfu"]["value"].values())
    assert all(m["rollout"]["source"].endswith(".json") for m in sections["mfu"]["value"].values())  # reused
    engines = sections["engines"]
    if engines["status"] == "ok":
        runs = [r for r in engines["value"]["runs"] if "engine" in r]
        assert sorted(r["trainer"]["rollout_engine"] for r in runs) == ["minimind", "trl"]
    else:
        assert engines["status"] == "engine option not available"
    assert sections["zero3_ranks"]["status"].startswith("needs 2 GPUs")  # a 2-GPU machine only
    judged = [t for t in report["targets"] if t["pass"] is not None]
    assert judged and all(t["pass"] for t in judged)  # quick: only the exact update-0 targets are judged


def test_time_guard_skips_the_remaining_parts(tmp_path):
    report = run(tmp_path, "--time-limit", "0")
    sections = report["sections"]
    assert sections["environment"]["status"] == "ok" and sections["environment"]["value"]["torch"]
    assert all(s["status"] == "skipped: time" and s["reason"] for n, s in sections.items() if n != "environment")
    assert report["complete"] is False


def test_a_failing_part_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import device_check

    def broken(ctx):
        raise RuntimeError("broken on purpose")

    monkeypatch.setitem(device_check.PARTS, "attention", broken)
    monkeypatch.delenv("DEVICE_CHECK_T0", raising=False)
    device_check.main(["--quick", str(tmp_path / "out.json"), "--parts", "environment,attention,mfu"])
    written = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    attention = written["sections"]["attention"]
    assert attention["status"] == "error" and attention["reason"] == "RuntimeError: broken on purpose"
    assert "broken on purpose" in attention["traceback"]
    assert written["sections"]["mfu"]["status"] == "ok"  # measured itself: no rollout/update output to reuse
    assert written["sections"]["mfu"]["value"]["tiny"]["update"]["source"] == "measured"
    assert written["sections"]["grpo_64m"]["status"] == "not requested" and written["complete"] is True
