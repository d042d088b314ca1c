"""Training rollouts (`MiniMindToolGRPOTrainer`: the project's driver through TRL's
``rollout_func``, both engines) against TRL 1.16's own tool loop with our protocol's hooks
(tests/trl_tool_loop.py): the same ids, masks and records, greedy; reproducible sampling."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from datasets import Dataset
from rollout_helpers import (  # tests/ is on sys.path (pytest's pythonpath)
    count_generate_calls,
    scripted,
    scripted_rows,
)
from trl import GRPOConfig, GRPOTrainer
from trl_tool_loop import TRLToolLoopHooks, record_from_completion

from minimind_trl.engine.decode import SliceStop, TurnCache, _Stored
from minimind_trl.engine.sampling import RowSampler, Sampling
from minimind_trl.engine.turns import generate_turns
from minimind_trl.envs.environment import make_environment_class
from minimind_trl.envs.protocol import TrajectoryRecord
from minimind_trl.envs.tools import default_registry
from minimind_trl.tokenization import load_tokenizer
from minimind_trl.trainer.config import MiniMindGRPOConfig
from minimind_trl.trainer.grpo_trainer import MiniMindToolGRPOTrainer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
KEYS = ("[call]", "[think]", "[hostile]", "[loop]", "[malformed]", "free")  # "free": unscripted
RECORD_FIELDS = [f.name for f in dataclasses.fields(TrajectoryRecord)]


class Recording(MiniMindToolGRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        self.last_batch = super()._generate_and_score_completions(inputs)
        self.last_records = [TrajectoryRecord(**{f: getattr(t, f) for f in RECORD_FIELDS})
                             for t in self.rollout.trajectories]
        self.last_messages = [t.messages for t in self.rollout.trajectories]
        return self.last_batch


class TRLToolLoop(TRLToolLoopHooks, GRPOTrainer):
    """TRL's own tool loop and generation, our prompts and tool turns: the oracle."""

    def _generate_and_score_completions(self, inputs):
        self.last_batch = super()._generate_and_score_completions(inputs)
        self.last_records = [env.record for env in self.environments]
        return self.last_batch


@pytest.fixture(scope="module")
def tokenizer():
    """Its own tokenizer, not the shared one: the tool trainers install `ParseGuard` on it."""
    return load_tokenizer()


TRAINING = dict(per_device_train_batch_size=12, num_generations=2, max_tool_calling_iterations=2, max_steps=1,
                learning_rate=1e-4, bf16=False, use_cpu=True, save_strategy="no", disable_tqdm=True)


def make_trainer(tmp_path, tokenizer, make_tiny_model, engine, moe=False, max_completion_length=1024, greedy=True,
                 seed=0):
    """``engine``: "minimind" or "trl" (our trainer), "oracle" (TRL's tool loop)."""
    registry = default_registry()
    rows = scripted_rows(registry, KEYS)
    model = scripted(make_tiny_model(moe=moe).train(), tokenizer)
    reward = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    if engine == "oracle":
        args = GRPOConfig(output_dir=str(tmp_path), max_completion_length=max_completion_length, seed=seed,
                          report_to="none", logging_steps=1, activation_checkpointing=False,
                          generation_kwargs={"do_sample": False} if greedy else None, **TRAINING)
        return TRLToolLoop(model=model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
                           reward_funcs=reward, environment_factory=make_environment_class(registry))
    args = MiniMindGRPOConfig(
        output_dir=str(tmp_path), max_completion_length=max_completion_length, num_iterations=1,
        gradient_checkpointing=False, report_to=[], seed=seed, rollout_engine=engine,
        generation_kwargs={"do_sample": False} if greedy else None, **TRAINING)
    return Recording(model=model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
                     reward_funcs=reward, tool_registry=registry)


def rollout_of(trainer):
    """Per row: (prompt ids, completion ids, tool mask, record) of the trainer's one rollout."""
    batch = trainer.last_batch
    out = []
    for i in range(len(trainer.last_records)):
        keep = batch["completion_mask"][i].bool()
        out.append((batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist(),
                    batch["completion_ids"][i][keep].tolist(), batch["tool_mask"][i][keep].tolist(),
                    trainer.last_records[i]))
    return out


@pytest.mark.parametrize("moe,length", [(False, 1024), (True, 1024), (False, 40)],
                         ids=["dense", "moe", "dense-truncated-at-40"])
def test_training_rollouts_equal_trls_tool_loop_token_for_token(tmp_path, tokenizer, make_tiny_model, moe, length):
    """0-2 tool rounds, a pending call at the cap, TRL's error observations for unknown tools,
    malformed calls, an unscripted row, and (40) completions cut by max_completion_length with
    tool results rolled back: every id, mask bit and record field of the driver (both engines)
    equals TRL's own tool loop, and each record equals the one read from the driver's messages."""
    runs, calls = {}, []
    for engine in ("oracle", "trl", "minimind"):
        trainer = make_trainer(tmp_path / engine, tokenizer, make_tiny_model, engine, moe=moe,
                               max_completion_length=length)
        if engine == "minimind":
            calls = count_generate_calls(trainer.model)  # the engine generates, in slices
        trainer.train()
        runs[engine] = rollout_of(trainer)
        if engine != "oracle":
            for (_, completion, mask, record), messages in zip(runs[engine], trainer.last_messages):
                assert record_from_completion(messages, completion, mask, tokenizer.eos_token_id) == record
    assert calls and calls[0] <= 12
    assert len(runs["oracle"]) == 12
    for oracle, trl_engine, minimind in zip(runs["oracle"], runs["trl"], runs["minimind"]):
        assert trl_engine == oracle
        assert minimind == oracle
    records = [row[3] for row in runs["oracle"]]
    if length == 1024:
        assert any(r.pending_call for r in records) and any(r.failed_calls for r in records)
        assert any(r.malformed_calls for r in records) and any(r.finished and r.valid_calls for r in records)
    else:
        assert any(r.truncated for r in records) and all(len(row[1]) <= 40 for row in runs["oracle"])


def test_sampled_rollouts_repeat_with_the_seed_and_change_with_it(tmp_path, tokenizer, make_tiny_model):
    rollouts = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        trainer = make_trainer(tmp_path / name, tokenizer, make_tiny_model, "minimind", greedy=False, seed=seed)
        trainer.train()
        rollouts.append([row[1] for row in rollout_of(trainer)])
    assert rollouts[0] == rollouts[1]
    assert rollouts[0] != rollouts[2]
    free = [ids for ids, key in zip(rollouts[0], [k for k in KEYS for _ in range(2)]) if key == "free"]
    assert free[0] != free[1]  # the two samples of one prompt differ (their own streams)


def test_generate_turns_does_not_depend_on_batching(tokenizer, make_tiny_model):
    """Per-row streams: the same contexts give the same samples whatever the batch size and slice."""
    model = make_tiny_model()
    g = torch.Generator().manual_seed(0)
    contexts = [torch.randint(21, 400, (n,), generator=g).tolist() for n in (5, 9, 9, 14, 3)]
    contexts.append(list(contexts[1]))  # a repeated context gets its own stream (occurrence 1)
    budgets = [12, 7, 7, 20, 1, 7]
    sampling = Sampling(do_sample=True, temperature=0.9, top_k=50, top_p=0.95, seed=5)
    with torch.no_grad():
        whole = generate_turns(model, contexts, budgets, [2], 0, sampling, stream="s")
        sliced = generate_turns(model, contexts, budgets, [2], 0, sampling, stream="s", batch_size=2,
                                decode_slice=3)
        other = generate_turns(model, contexts, budgets, [2], 0, sampling, stream="t")
        greedy = generate_turns(model, contexts, budgets, [2], 0, Sampling(do_sample=False), batch_size=2)
        reference = [model.generate(torch.tensor([c]), max_new_tokens=b, do_sample=False, eos_token_id=2,
                                    pad_token_id=0)[0, len(c):].tolist() for c, b in zip(contexts, budgets)]
    assert whole == sliced and whole != other
    assert all(len(ids) <= b for ids, b in zip(whole, budgets)) and whole[1] != whole[5]
    assert greedy == [ids[:ids.index(2) + 1] if 2 in ids else ids for ids in reference]


def test_slice_stop_fires_once_ended_rows_would_waste_enough_row_steps():
    """4 rows, a call of 10 steps after 3 input columns, min_saved 12: ended rows x steps left."""
    stop = SliceStop(width=3, steps=10, eos_token_ids=[2, 7], min_saved=12)
    ids = torch.full((4, 3), 5)
    ids = torch.cat([ids, torch.tensor([[5], [2], [5], [5]])], 1)  # step 1: one ended, 9 left: 9 < 12
    assert stop(ids, None).tolist() == [False] * 4
    ids = torch.cat([ids, torch.tensor([[5], [0], [7], [5]])], 1)  # step 2: row 1 padded, row 2 ends: 2 x 8
    assert stop(ids, None).tolist() == [True] * 4
    every = SliceStop(width=0, steps=10, eos_token_ids=[2], min_saved=1)
    assert every(torch.tensor([[2], [2]]), None).tolist() == [False, False]  # all ended: generate stops itself
    late = SliceStop(width=0, steps=3, eos_token_ids=[2], min_saved=1)
    late(torch.tensor([[2], [5]]), None)
    late(torch.tensor([[2, 0], [5, 5]]), None)
    assert late(torch.tensor([[2, 0, 0], [5, 5, 5]]), None).tolist() == [False, False]  # last step: 0 left


def test_ending_generate_calls_early_changes_no_id(tokenizer, make_tiny_model):
    """`generate_turns` with a call ended at every eos (min_saved 1), at the default, and never
    early: the same ids, sampled and greedy; the early ends happened (more generate calls)."""
    model = make_tiny_model()
    g = torch.Generator().manual_seed(3)
    contexts = [torch.randint(21, 400, (n,), generator=g).tolist() for n in (5, 9, 9, 14, 3, 7, 11, 6)]
    eos = [t for t in range(3, 400) if t % 6 == 0]  # frequent "eos" ids, so rows end at many steps
    calls = count_generate_calls(model)
    runs = {}
    with torch.no_grad():
        for sampling in (Sampling(do_sample=True, temperature=0.9, top_k=50, seed=2), Sampling(do_sample=False)):
            for min_saved in (1, 32, 10**9):
                calls.clear()
                ids = generate_turns(model, contexts, [30] * 8, eos, 0, sampling, stream="s", decode_slice=16,
                                     min_saved_row_steps=min_saved)
                runs[sampling.do_sample, min_saved] = (ids, len(calls))
    for sampled in (True, False):
        ids, early_calls = runs[sampled, 1]
        assert ids == runs[sampled, 32][0] == runs[sampled, 10**9][0]
        ended = [row for row in ids if row[-1] in eos]
        assert 2 <= len(ended) < len(ids) and early_calls > runs[sampled, 10**9][1]
        if sampled:  # the random model's greedy rows repeat one token: only sampled rows end at many steps
            assert len({len(row) for row in ended}) >= 3


def test_minimind_engine_refuses_settings_it_does_not_implement(tmp_path):
    with pytest.raises(ValueError, match="rollout.engine: trl"):
        MiniMindGRPOConfig(output_dir=str(tmp_path), rollout_engine="minimind", repetition_penalty=1.1,
                           use_cpu=True, report_to=[], bf16=False, num_generations=2,
                           per_device_train_batch_size=2)


def test_a_resumed_turn_equals_a_fresh_encoding(tokenizer, make_tiny_model):
    """With a TurnCache, the next turn of a row feeds only its new ids and generates what a fresh
    encoding of the whole context generates (greedy), for rows resumed from different widths."""
    model = make_tiny_model()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(21, 400, (n,), generator=g).tolist() for n in (6, 11, 11, 4)]
    greedy, cache = Sampling(do_sample=False), TurnCache()
    with torch.no_grad():
        first = generate_turns(model, prompts, [9, 5, 13, 7], [2], 0, greedy, batch_size=3, decode_slice=4,
                               cache=cache)
        suffixes = [torch.randint(21, 400, (n,), generator=g).tolist() for n in (3, 8, 1, 5)]
        second = [p + f + s for p, f, s in zip(prompts, first, suffixes)]
        resumed = generate_turns(model, second, [8] * 4, [2], 0, greedy, batch_size=3, decode_slice=4, cache=cache)
        fresh = generate_turns(model, second, [8] * 4, [2], 0, greedy, batch_size=3, decode_slice=4)
    assert cache.hits == 4 and resumed == fresh


def test_identical_rows_each_resume_their_next_turn(tokenizer, make_tiny_model):
    """Two samples of a prompt that write the same turn and get the same tool turn both resume
    (one stored entry each), and generate what a fresh encoding generates."""
    model = make_tiny_model()
    g = torch.Generator().manual_seed(2)
    prompt, other = (torch.randint(21, 400, (n,), generator=g).tolist() for n in (9, 5))
    greedy, cache = Sampling(do_sample=False), TurnCache()
    with torch.no_grad():
        first = generate_turns(model, [prompt, prompt, other], [6, 6, 6], [2], 0, greedy, cache=cache)
        assert first[0] == first[1] and cache.size == 3
        tool = [300, 301, 302]
        second = [c + f + tool for c, f in zip([prompt, prompt, other], first)]
        resumed = generate_turns(model, second, [5] * 3, [2], 0, greedy, cache=cache)
        fresh = generate_turns(model, second, [5] * 3, [2], 0, greedy)
    assert cache.hits == 3 and resumed == fresh


def test_turn_cache_keeps_at_most_max_rows_entries_oldest_dropped(make_tiny_model):
    model = make_tiny_model()
    cache = TurnCache(max_rows=2)

    def entry(ids):
        kv = [(torch.zeros(1, 2, len(ids), 16), torch.zeros(1, 2, len(ids), 16))] * model.config.num_hidden_layers
        return _Stored(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), kv)

    cache.store([5, 6], entry([5, 6]))
    cache.store([5, 6], entry([5, 6]))
    cache.store([7, 8], entry([7, 8]))  # the first [5, 6] entry is dropped
    assert cache.size == 2 and len(cache.rows[(5, 6)]) == 1
    assert cache.resume(model, [5, 6, 9]).pending == 1
    assert cache.resume(model, [5, 6, 9]) is None  # its one entry was used
    assert cache.resume(model, [7, 8, 9, 10]).pending == 2 and cache.size == 0 and cache.hits == 2


def test_row_sampler_draws_from_the_warped_distribution():
    """Inverse-CDF draws follow softmax(warped logits): frequencies within sampling error over 20k
    draws; filtered (top-k) tokens never come out; each row's draws come from its own stream."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]]).repeat(2, 1)
    sampler = RowSampler(Sampling(temperature=0.7, top_k=3))
    expected = torch.softmax(torch.tensor([2.0, 1.0, 0.0]) / 0.7, dim=0)
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    sampler.generators = gens
    counts = torch.zeros(2, 5)
    for _ in range(10000):
        chosen = sampler(torch.zeros(2, 1, dtype=torch.long), logits.clone()).argmax(dim=1)
        counts[torch.arange(2), chosen] += 1
    freq = counts / counts.sum(dim=1, keepdim=True)
    assert (counts[:, 3:] == 0).all()
    assert (freq[:, :3] - expected).abs().max() < 0.015  # ~4 standard errors at n = 10,000
    sampler.generators = [torch.Generator().manual_seed(1)]  # row 0's stream alone: same first draw
    first = sampler(torch.zeros(1, 1, dtype=torch.long), logits[:1].clone()).argmax(dim=1)
    sampler.generators = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(9)]
    assert sampler(torch.zeros(2, 1, dtype=torch.long), logits.clone()).argmax(dim=1)[0] == first
