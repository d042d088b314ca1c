"""Per-row sampling streams keyed by the global row (``rollout.sampling_streams: global_row``,
issue 25 F): one seed gives the same trajectories on 1 and 2 processes; the per-process streams
(the default) do not. The 2-process run is torchrun on gloo (this file's ``__main__``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from helpers import free_tool_trainer, run_two_cpu_ranks

from minimind_trl.engine.sampling import Sampling, row_generators
from minimind_trl.trainer.grpo_trainer import MiniMindToolGRPOTrainer

MODES = ("global_row", "process")
SETTINGS = dict(max_steps=1, num_iterations=1, max_completion_length=12, temperature=1.0)


def test_row_keys_replace_the_occurrence_in_the_seed():
    sampling = Sampling(seed=3)
    contexts = [[5, 6], [5, 6]]

    def first_draws(generators):
        return [torch.rand(1, generator=g).item() for g in generators]

    by_occurrence = first_draws(row_generators(contexts, sampling, "s", torch.device("cpu")))
    assert by_occurrence[0] != by_occurrence[1]  # the samples of one prompt differ
    keyed = first_draws(row_generators(contexts, sampling, "s", torch.device("cpu"), row_keys=[0, 1]))
    assert keyed == by_occurrence  # keys 0, 1 are the occurrences here
    # a row's stream follows its key, not its place in the call
    alone = first_draws(row_generators([[5, 6]], sampling, "s", torch.device("cpu"), row_keys=[1]))
    assert alone == [keyed[1]]
    with pytest.raises(ValueError, match="one row key per context"):
        row_generators(contexts, sampling, "s", torch.device("cpu"), row_keys=[0])


def _rollouts(run_dir: Path, per_device: int, mode: str) -> list[list[int]]:
    """The completion ids of this process's rows in the first rollout."""
    seen: list[list[int]] = []
    original = MiniMindToolGRPOTrainer.tool_rollout

    def capture(self, prompts):
        result = original(self, prompts)
        seen.extend(list(map(list, result["completion_ids"])))
        return result

    MiniMindToolGRPOTrainer.tool_rollout = capture
    try:
        free_tool_trainer(run_dir, per_device_train_batch_size=per_device, sampling_streams=mode, **SETTINGS).train()
    finally:
        MiniMindToolGRPOTrainer.tool_rollout = original
    return seen


@pytest.mark.slow
def test_global_row_streams_give_one_process_trajectories_on_two(tmp_path):
    done = run_two_cpu_ranks(str(Path(__file__)), tmp_path / "two")
    files = [tmp_path / "two" / f"rows_rank{rank}.json" for rank in (0, 1)]
    assert all(f.is_file() for f in files), done.stdout[-3000:] + done.stderr[-3000:]
    two = [json.loads(f.read_text()) for f in files]  # [rank][mode] -> rows
    for mode in MODES:
        one = _rollouts(tmp_path / f"one_{mode}", 8, mode)
        assert len(one) == 8 and len(two[0][mode]) == len(two[1][mode]) == 4
        if mode == "global_row":
            assert two[0][mode] + two[1][mode] == one  # every row, token for token
        else:  # process 0 draws what one process draws; process 1's streams name process 1
            assert two[0][mode] == one[:4] and two[1][mode] != one[4:]


def _main(run_dir: str) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    rows = {mode: _rollouts(Path(run_dir) / mode, 4, mode) for mode in MODES}
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / f"rows_rank{rank}.json").write_text(json.dumps(rows))
    sys.stdout.flush()
    os._exit(0)  # gloo sometimes aborts at interpreter exit after a finished run


if __name__ == "__main__":
    _main(sys.argv[1])
