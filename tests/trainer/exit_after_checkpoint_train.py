"""``minimind-trl train`` whose every process exits right after the checkpoint of step
``EXIT_AFTER_STEP`` is written (as a killed run would), for test_deepspeed_ranks.py's resume test.

Launched by ``accelerate launch``; the exit code is 17.
"""

from __future__ import annotations

import os
import sys

from transformers import TrainerCallback

from minimind_trl.trainer import cli, run

STEP = int(os.environ["EXIT_AFTER_STEP"])
_run_training = run.run_training


class ExitAfterCheckpoint(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == STEP:
            sys.stdout.flush()
            os._exit(17)


def run_training_then_exit(trainer, run_dir, resume_from):
    trainer.add_callback(ExitAfterCheckpoint())
    return _run_training(trainer, run_dir, resume_from)


run.run_training = run_training_then_exit

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
