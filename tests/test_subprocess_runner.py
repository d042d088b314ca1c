"""minimind_trl.subprocess_runner.run_cli: the child process of the sweep and the demo."""

from __future__ import annotations

import io
import sys

import pytest

from minimind_trl.subprocess_runner import CommandFailed, cli_command, is_chatter, run_cli


def test_cli_command_uses_this_interpreter_or_the_launcher():
    assert cli_command(["eval", "--help"]) == [sys.executable, "-m", "minimind_trl.cli", "eval", "--help"]
    assert cli_command(["train"], "torchrun --nproc_per_node 4") == [
        "torchrun", "--nproc_per_node", "4", "-m", "minimind_trl.cli", "train"]


def test_output_is_logged_whole_and_echoed_without_chatter(tmp_path):
    log = tmp_path / "logs" / "a.log"
    echoed = io.StringIO()
    assert run_cli(["--version"], log, echo=True, stream=echoed) == 0
    text = log.read_text()
    assert text.startswith("\n=== ") and "-m minimind_trl.cli --version" in text
    version_line = text.splitlines()[-1]
    assert echoed.getvalue() == f"    {version_line}\n"
    assert run_cli(["--version"], log, append=False, header=False) == 0
    assert log.read_text() == version_line + "\n"  # rewritten, no header
    assert is_chatter("[2026-01-01 12:00:00,000] [INFO] [real_accelerator.py] Setting ds_accelerator")
    assert is_chatter("  warnings.warn(") and not is_chatter("step 1: loss 0.5")


def test_a_failing_command_names_its_log(tmp_path):
    log = tmp_path / "bad.log"
    assert run_cli(["no-such-command"], log) != 0
    with pytest.raises(CommandFailed, match=r"`minimind-trl no-such-command` failed with exit code 2; see .*bad\.log"):
        run_cli(["no-such-command"], log, check=True)
    assert "no-such-command" in log.read_text()
