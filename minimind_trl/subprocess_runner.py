"""The one way the sweep and the demo run a ``minimind-trl`` command in a child process.

:func:`run_cli` runs ``python -m minimind_trl.cli ARGS`` (or ``LAUNCHER -m minimind_trl.cli ARGS``
for multi-process training, e.g. ``torchrun --nproc_per_node 4``), writes every line of its output
(stdout and stderr merged) to a log file, optionally echoes the lines to this process's stdout
without the known library chatter (:data:`CHATTER_PREFIXES`), and returns the exit code, or with
``check=True`` raises :class:`CommandFailed` naming the command and the log. Imports nothing from
the package.
"""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

CHATTER_PREFIXES = ("[20", "  warnings.warn")
"""Output lines not echoed (still logged): DeepSpeed / accelerate log lines (``[2026-...``) and the
source line Python prints under a warning."""


class CommandFailed(RuntimeError):
    """A ``minimind-trl`` command exited non-zero; carries ``args``, ``returncode`` and ``log``."""

    def __init__(self, args: Sequence[str], returncode: int, log: Path):
        self.args_ = list(args)
        self.returncode = returncode
        self.log = Path(log)
        super().__init__(f"`minimind-trl {args[0] if args else ''}` failed with exit code {returncode}; see {log}")


def cli_command(args: Sequence[str], launcher: str | None = None) -> list[str]:
    """The argv that runs ``minimind-trl ARGS``: under ``launcher`` (a shell-quoted prefix that
    takes ``-m MODULE``) when given, else this interpreter."""
    prefix = shlex.split(launcher) if launcher else [sys.executable]
    return [*prefix, "-m", "minimind_trl.cli", *args]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def is_chatter(line: str) -> bool:
    """True for an output line that is library noise, not the command's own output."""
    return line.startswith(CHATTER_PREFIXES)


def run_cli(args: Sequence[str], log: str | os.PathLike, *, launcher: str | None = None, append: bool = True,
            header: bool = True, echo: bool = False, echo_indent: str = "    ", check: bool = False,
            stream: TextIO | None = None, env: dict[str, str] | None = None) -> int:
    """Run ``minimind-trl ARGS`` in a child process; returns its exit code.

    ``log``: every output line goes there (the folder is created); ``append`` keeps earlier
    content, else the file is rewritten. ``header``: first write ``=== TIME $ COMMAND``.
    ``echo``: also print each line, indented by ``echo_indent``, to ``stream`` (default
    ``sys.stdout``) unless :func:`is_chatter`. ``check``: raise :class:`CommandFailed` (naming the
    log) on a non-zero exit. ``env``: the child's environment (default: this process's).
    """
    log = Path(log)
    command = cli_command(args, launcher)
    log.parent.mkdir(parents=True, exist_ok=True)
    out = stream if stream is not None else sys.stdout
    with open(log, "a" if append else "w", encoding="utf-8") as handle:
        if header:
            handle.write(f"\n=== {_now()} $ {shlex.join(command)}\n")
            handle.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                   errors="replace", env=env)
        assert process.stdout is not None
        with process.stdout:
            for line in process.stdout:
                handle.write(line)
                handle.flush()
                if echo and not is_chatter(line):
                    out.write(echo_indent + line)
                    out.flush()
        code = process.wait()
    if check and code != 0:
        raise CommandFailed(args, code, log)
    return code
