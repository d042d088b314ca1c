"""Throughput of the batched multi-turn tool rollout against a naive one-trajectory-at-a-time loop.

What is measured
----------------
``minimind_trl.envs.rollout.rollout`` on generated agent-math tasks, with a random-weight MiniMind.
A random model does not call tools by itself, so every model turn is *scripted*: a logits
processor, passed to ``model.generate`` by a thin wrapper, leaves only the next token of the turn's
script allowed. The model still runs a full forward pass (KV cache, batch, padding) for every
token, exactly as when it samples; only the choice of the token is forced. Each trajectory gets
``T`` tool turns (``--tool-turns``), each calling the task's next reference call (from
``meta.calls``, cycled), then a final answer (the gold trajectory's answer); the tools really run
and their observations are appended as ids. ``--filler-words N`` puts N words of plain text before
each turn's tool call (longer turns). ``max_tool_turns`` is set to ``T``, so each trajectory has
exactly ``T + 1`` model turns.

``--samples-per-task G`` rolls out each of ``--num-tasks / G`` tasks G times (task-major), as
pass@k evaluation samples a question and a GRPO group repeats a prompt; G = 1 is the greedy
evaluation's workload (every prompt different). ``--task-mix``: ``all`` (the generator's full mix,
up to 2 distractor tools, so tool lists differ) and/or ``demo`` (the demo's tasks: prompts share
their system turn and tool list).

The naive loop, written here, runs one trajectory at a time, turn by turn: ``model.generate`` on
that trajectory's context alone (same generation config, same KV cache use, same scripted
processor), parses the turn, runs its calls, appends the tool turn ids. It produces the same
tokens as the batched rollout (checked: ``identical`` column). Both are timed end to end
(prompt rendering, generation, parsing, tool calls). Reported per (samples per task, tool turns,
batch size): trajectories/s, generated (model) tokens/s, the speed-up over the naive loop at the
same workload, peak memory, the positions every forward computed (pads included) and the time
spent in *encode* forwards (several positions per row: prompts, tool turns) apart from *decode*
forwards (one position per row), and the achieved FLOP/s ``2 * N * positions / seconds``.

Target: batched rollout at batch 32 >= 5x the naive loop (trajectories/s).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _common import (  # noqa: E402
    PRESETS,
    PeakMemory,
    build_model,
    common_parser,
    environment,
    int_list,
    print_table,
    print_targets,
    setup,
    sync,
    write_json,
)
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList  # noqa: E402
from trl.chat_template_utils import parse_response  # noqa: E402

from minimind_trl.conversation import task_prompt  # noqa: E402
from minimind_trl.data import generate_tasks, gold_trajectory  # noqa: E402
from minimind_trl.demo import TASK_FILTER  # noqa: E402
from minimind_trl.envs.environment import call_as_trl, environment_tools, make_environment_class  # noqa: E402
from minimind_trl.envs.protocol import prompt_ids_for, tool_turn_ids  # noqa: E402
from minimind_trl.envs.rollout import rollout  # noqa: E402
from minimind_trl.envs.tools import default_registry  # noqa: E402
from minimind_trl.tokenization import load_tokenizer  # noqa: E402

TARGET_BATCH = 32
TARGET_SPEEDUP = 5.0
FILLER = ("let", "me", "work", "this", "out", "step", "by", "step", "and", "check")


# ------------------------------------------------------------------------------------ scripting


def turn_scripts(task: dict, registry: Any, tool_turns: int, filler_words: int) -> list[str]:
    """Texts of the ``tool_turns + 1`` model turns of a task: one reference call per tool turn
    (cycled), then the gold final answer. Each turn may start with ``filler_words`` words."""
    calls = json.loads(task["meta"]["calls"])
    answer = next(m["content"] for m in reversed(gold_trajectory(task, registry)["conversations"])
                  if m["role"] == "assistant" and m.get("content"))
    filler = " ".join(FILLER[i % len(FILLER)] for i in range(filler_words))
    prefix = filler + "\n" if filler else ""
    turns = []
    for k in range(tool_turns):
        call = calls[k % len(calls)]
        body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
        turns.append(f"{prefix}<tool_call>\n{body}\n</tool_call>")
    turns.append(f"{prefix}{answer}")
    return turns


class ScriptedTurns(LogitsProcessor):
    """Leaves one allowed token per row and step: the next token of the row's script (set by
    :class:`ScriptedGenerate` before each ``generate`` call); past the script's end, eos."""

    def __init__(self) -> None:
        self.script: torch.Tensor | None = None  # [B, W] token ids still to write, eos-padded
        self.start = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        position = min(input_ids.shape[1] - self.start, self.script.shape[1] - 1)
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, self.script[:, position : position + 1], 0.0)
        return forced


class ScriptedGenerate:
    """Replaces ``model.generate`` (instance attribute) so that every call is scripted.

    For each row of the batch it finds the task (the context starts with the task's prompt ids),
    the turn (two eos per finished model turn + tool turn after the prompt) and how much of the
    turn is already written (a call may start inside a turn: the rollout decodes in slices), and
    forces the rest of that turn's token ids followed by eos."""

    def __init__(self, model: Any, tokenizer: Any, prompts: list[list[int]], scripts: list[list[list[int]]]):
        self.model = model
        self.original = model.generate
        self.eos = tokenizer.eos_token_id
        self.prompts = {}
        for index, prompt in enumerate(prompts):
            self.prompts.setdefault(len(prompt), {})[tuple(prompt)] = index
        self.prompt_eos = [prompt.count(self.eos) for prompt in prompts]
        # The generation prompt that follows the last eos of a prompt or of a tool turn.
        self.opener = prompts[0][::-1].index(self.eos)
        self.scripts = scripts  # task -> turn -> ids (eos included)
        self.processor = ScriptedTurns()
        self.calls = 0

    def remaining(self, context: list[int]) -> list[int]:
        for length, table in self.prompts.items():
            task = table.get(tuple(context[:length]))
            if task is not None:
                turn = (context.count(self.eos) - self.prompt_eos[task]) // 2
                written = context[::-1].index(self.eos) - self.opener  # tokens after the last eos
                return self.scripts[task][turn][written:]
        raise KeyError("scripted rollout: a context that starts with no known prompt")

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, generation_config: Any, **kw):
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]
        scripts = [self.remaining(row) for row in rows]
        width = max(len(s) for s in scripts)
        table = torch.full((len(scripts), width), self.eos, dtype=torch.long)
        for i, script in enumerate(scripts):
            table[i, : len(script)] = torch.tensor(script)
        self.processor.script = table.to(input_ids.device)
        self.processor.start = input_ids.shape[1]
        self.calls += 1
        return self.original(input_ids=input_ids, attention_mask=attention_mask,
                             generation_config=generation_config,
                             logits_processor=LogitsProcessorList([self.processor]), **kw)

    def __enter__(self) -> "ScriptedGenerate":
        self.model.generate = self
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.model.generate  # back to the class's method


class ForwardCounter:
    """Positions every forward of the model computes (pads included) and the time spent in them,
    split into *encode* forwards (several positions per row: prompts, tool turns) and *decode*
    forwards (one position per row). Hooks on the model; the device is synchronised around each
    forward, so the times are exact but the total runs a little slower on a GPU."""

    def __init__(self, model: Any, device: torch.device):
        self.model, self.device = model, device
        self.tokens = {"encode": 0, "decode": 0}
        self.seconds = {"encode": 0.0, "decode": 0.0}
        self._start = 0.0
        self._kind = "decode"

    def _before(self, module: Any, args: Any, kwargs: dict) -> None:
        ids = kwargs.get("input_ids")
        self._kind = "encode" if ids.shape[1] > 1 else "decode"
        self.tokens[self._kind] += ids.numel()
        sync(self.device)
        self._start = time.perf_counter()

    def _after(self, module: Any, args: Any, kwargs: dict, output: Any) -> None:
        sync(self.device)
        self.seconds[self._kind] += time.perf_counter() - self._start

    def __enter__(self) -> "ForwardCounter":
        self.handles = [self.model.register_forward_pre_hook(self._before, with_kwargs=True),
                        self.model.register_forward_hook(self._after, with_kwargs=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()


# ------------------------------------------------------------------------------------ naive loop


def naive_rollout(model: Any, tokenizer: Any, tasks: list[dict], registry: Any, max_tool_turns: int,
                  max_new_tokens: int) -> list[dict]:
    """One trajectory at a time: generate a turn on its own context, parse, call tools, append.

    The token protocol is the one ``rollout`` documents (turn ends at eos; calls parsed by TRL's
    ``parse_response`` with the registry's schemas and run as TRL's loop runs them; tool turn ids
    from the chat template)."""
    run_tools = environment_tools(make_environment_class(registry)())

    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id, use_cache=True, do_sample=False)
    schemas = registry.schemas()
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    out = []
    with torch.no_grad():
        for task in tasks:
            messages, tools = task_prompt(task)
            prompt = prompt_ids_for(tokenizer, messages, tools)
            completion: list[int] = []
            action: list[int] = []
            for turn in range(max_tool_turns + 1):
                context = prompt + completion
                ids = torch.tensor([context], device=device)
                new = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     generation_config=config)[0, len(context):].tolist()
                if eos in new:
                    new = new[: new.index(eos) + 1]
                completion += new
                action += [1] * len(new)
                if not new or new[-1] != eos:
                    break
                message = parse_response(tokenizer, new, prefix=context, tools=schemas)
                calls = [c.get("function", c) for c in message.get("tool_calls") or []]
                if not calls or turn >= max_tool_turns:
                    break
                observations = [call_as_trl(run_tools, c["name"], c["arguments"]) for c in calls]
                suffix = tool_turn_ids(tokenizer, [c["name"] for c in calls], observations)
                completion += suffix
                action += [0] * len(suffix)
            out.append({"completion_ids": completion, "action_mask": action})
    return out


# ------------------------------------------------------------------------------------ benchmark


def run_case(kind: str, model: Any, tokenizer: Any, tasks: list[dict], samples: int, registry: Any,
             scripts: Any, prompts: list[list[int]], tool_turns: int, batch_size: int, max_new_tokens: int,
             device: torch.device, n_params: int, limit: int | None = None) -> tuple[dict[str, Any], list[list[int]]]:
    """One timed rollout of every task ``samples`` times (task-major): the batched ``rollout``, or
    the naive loop over the first ``limit`` of those trajectories."""
    expanded = [t for t in range(len(tasks)) for _ in range(samples)][:limit]
    with ScriptedGenerate(model, tokenizer, prompts, scripts) as scripted, PeakMemory(device) as memory, \
            ForwardCounter(model, device) as counter:
        sync(device)
        start = time.perf_counter()
        if kind == "batched":
            trajectories = rollout(model, tokenizer, tasks, registry, max_tool_turns=tool_turns,
                                   max_new_tokens=max_new_tokens, batch_size=batch_size, num_samples=samples,
                                   progress=False)
            rows = [{"completion_ids": t.completion_ids, "action_mask": t.action_mask,
                     "n_turns": t.n_turns, "finished": t.finished, "valid_calls": t.valid_calls}
                    for t in trajectories]
        else:
            rows = naive_rollout(model, tokenizer, [tasks[t] for t in expanded], registry, tool_turns,
                                 max_new_tokens)
        sync(device)
        seconds = time.perf_counter() - start
    generated = sum(sum(r["action_mask"]) for r in rows)
    expected_generated = sum(len(ids) for t in expanded for ids in scripts[t])
    positions = counter.tokens["encode"] + counter.tokens["decode"]
    result = {
        "kind": kind,
        "batch_size": batch_size if kind == "batched" else 1,
        "samples_per_task": samples,
        "tool_turns": tool_turns,
        "trajectories": len(rows),
        "seconds": seconds,
        "trajectories_per_s": len(rows) / seconds,
        "generated_tokens": generated,
        "generated_tokens_per_s": generated / seconds,
        "encode_positions": counter.tokens["encode"],
        "decode_positions": counter.tokens["decode"],
        "encode_seconds": counter.seconds["encode"],
        "decode_seconds": counter.seconds["decode"],
        "generate_calls": scripted.calls,
        "achieved_flops_per_s": 2.0 * n_params * positions / seconds,
        "decode_flops_per_s": 2.0 * n_params * generated / seconds,
        "scripted_tokens_generated": generated == expected_generated,
        "memory": memory.as_dict(),
    }
    if kind == "batched":
        result["all_finished"] = all(r["finished"] and r["n_turns"] == tool_turns + 1 for r in rows)
        result["valid_calls_per_trajectory"] = sum(r["valid_calls"] for r in rows) / len(rows)
    return result, [r["completion_ids"] for r in rows]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = common_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="auto", choices=["auto", *PRESETS],
                        help="MiniMind size (random weights); auto = demo on CPU, minimind-3 on GPU")
    parser.add_argument("--batch-sizes", type=int_list, default=[1, 8, 32], help="rollout batch sizes")
    parser.add_argument("--tool-turns", type=int_list, default=[0, 1, 3], help="tool turns per trajectory")
    parser.add_argument("--samples-per-task", type=int_list, default=[1, 8],
                        help="trajectories per task: 1 = distinct prompts (greedy evaluation); 8 = the samples "
                             "of pass@k evaluation or a GRPO group (--num-tasks / G distinct tasks, G each)")
    parser.add_argument("--task-mix", type=lambda text: text.split(","), default=["all", "demo"],
                        help="comma-separated: all = every op type, up to 2 distractor tools (prompts differ in "
                             "their tool lists); demo = the demo's tasks (no distractors: prompts share the "
                             "system turn and tool list)")
    parser.add_argument("--num-tasks", type=int, default=None,
                        help="trajectories per measurement (default: the largest batch size)")
    parser.add_argument("--naive-tasks", type=int, default=None,
                        help="trajectories the naive loop runs (a prefix of the same ones; default all)")
    parser.add_argument("--filler-words", type=int, default=0, help="plain words before each turn's text")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="per-turn budget")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per case (best kept)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up rollout")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.batch_sizes, args.tool_turns, args.samples_per_task = "tiny", [2], [1], [1, 2]
        args.task_mix = ["all"]
        args.num_tasks, args.naive_tasks, args.max_new_tokens, args.no_warmup = 2, 1, 128, True
    device, dtype = setup(args)
    preset = args.preset if args.preset != "auto" else ("minimind-3" if device.type == "cuda" else "demo")
    num_tasks = args.num_tasks or max(args.batch_sizes)
    for samples in args.samples_per_task:
        if samples < 1 or num_tasks % samples:
            raise SystemExit(f"--samples-per-task {samples} must divide the {num_tasks} trajectories")
    if not args.task_mix or not set(args.task_mix) <= {"all", "demo"}:
        raise SystemExit(f"--task-mix: give all and/or demo, not {','.join(args.task_mix)}")

    tokenizer = load_tokenizer()
    registry = default_registry()
    model, model_info = build_model(preset, device, dtype, seed=args.seed)
    n_params = model_info["active_parameters"]
    eos = tokenizer.eos_token_id

    def workload(mix: str) -> tuple[list[dict], list[list[int]]]:
        tasks = generate_tasks(num_tasks, args.seed, **(TASK_FILTER if mix == "demo" else {}))
        return tasks, [prompt_ids_for(tokenizer, *task_prompt(task)) for task in tasks]

    def scripts_for(tasks: list[dict], turns: int) -> list[list[list[int]]]:
        out = []
        for task in tasks:
            texts = turn_scripts(task, registry, turns, args.filler_words)
            out.append([tokenizer(text, add_special_tokens=False)["input_ids"] + [eos] for text in texts])
        longest = max(len(ids) for task_scripts in out for ids in task_scripts)
        if longest > args.max_new_tokens:
            raise SystemExit(f"a scripted turn has {longest} tokens > --max-new-tokens {args.max_new_tokens}")
        return out

    print(f"rollout benchmark: {preset} ({n_params:,} parameters, {model_info['dtype']}) on {device}, "
          f"{num_tasks} trajectories per measurement (naive loop: {args.naive_tasks or num_tasks})")
    if not args.no_warmup:
        tasks, prompts = workload(args.task_mix[0])
        run_case("batched", model, tokenizer, tasks, 1, registry, scripts_for(tasks, 1), prompts, 1,
                 max(args.batch_sizes), args.max_new_tokens, device, n_params)

    results: list[dict[str, Any]] = []
    for mix in args.task_mix:
        tasks, prompts = workload(mix)
        for samples in args.samples_per_task:
            distinct = tasks[: num_tasks // samples]
            for turns in args.tool_turns:
                scripts = scripts_for(tasks, turns)
                common = dict(registry=registry, scripts=scripts, prompts=prompts, tool_turns=turns,
                              max_new_tokens=args.max_new_tokens, device=device, n_params=n_params)
                naive, naive_ids = min(
                    (run_case("naive", model, tokenizer, distinct, samples, batch_size=1, limit=args.naive_tasks,
                              **common) for _ in range(args.repeats)),
                    key=lambda pair: pair[0]["seconds"])
                naive["speedup_vs_naive"] = 1.0
                case = [naive]
                for batch in args.batch_sizes:
                    best, ids = min(
                        (run_case("batched", model, tokenizer, distinct, samples, batch_size=batch, **common)
                         for _ in range(args.repeats)),
                        key=lambda pair: pair[0]["seconds"])
                    best["speedup_vs_naive"] = best["trajectories_per_s"] / naive["trajectories_per_s"]
                    best["identical_to_naive"] = ids[: len(naive_ids)] == naive_ids
                    case.append(best)
                results += [{"task_mix": mix, **r} for r in case]

    rows = [[r["kind"], r["task_mix"], r["samples_per_task"], r["tool_turns"], r["batch_size"], r["trajectories"],
             r["seconds"], r["encode_seconds"], r["trajectories_per_s"], r["generated_tokens_per_s"],
             r["speedup_vs_naive"], r.get("identical_to_naive", "-"), r["memory"]["peak_mib"],
             r["achieved_flops_per_s"] / 1e9]
            for r in results]
    print_table("Rollout throughput (scripted turns; speed-up = trajectories/s over the naive loop; "
                "encode s = time in forwards of several positions per row: prompts, tool turns)",
                ["loop", "tasks", "samples/task", "tool turns", "batch", "traj", "seconds", "encode s", "traj/s",
                 "gen tok/s", "speed-up", "identical", "peak MiB", "GFLOP/s"], rows)

    targets = []
    at_target = [r for r in results if r["kind"] == "batched" and r["batch_size"] == TARGET_BATCH]
    for r in at_target:
        targets.append({"name": f"rollout speed-up at batch {TARGET_BATCH}, {r['task_mix']} tasks, "
                                f"{r['samples_per_task']} sample(s) per task, {r['tool_turns']} tool turns",
                        "measured": f"{r['speedup_vs_naive']:.2f}x",
                        "target": f">= {TARGET_SPEEDUP:g}x", "pass": r["speedup_vs_naive"] >= TARGET_SPEEDUP})
    if not at_target:
        targets.append({"name": f"rollout speed-up at batch {TARGET_BATCH}", "measured": "not measured",
                        "target": f">= {TARGET_SPEEDUP:g}x", "pass": None})
    checks_ok = all(r["scripted_tokens_generated"] for r in results) and all(
        r.get("identical_to_naive", True) and r.get("all_finished", True) for r in results)
    targets.append({"name": "scripted trajectories complete and identical to the naive loop",
                    "measured": str(checks_ok), "target": "True", "pass": checks_ok})
    print_targets(targets)

    payload = {
        "benchmark": "rollout",
        "what": "multi-turn tool rollout with scripted (forced) turns; see the module docstring",
        "quick": args.quick,
        "environment": environment(device),
        "model": model_info,
        "settings": {k: v for k, v in vars(args).items() if k not in ("output",)},
        "results": results,
        "targets": targets,
    }
    write_json(args.output, payload)
    return payload


if __name__ == "__main__":
    main()
