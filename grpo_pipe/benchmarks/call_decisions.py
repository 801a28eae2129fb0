"""Benchmark: does the decision to call the tool again follow the task? Read off a model, before or after training.

    python -m grpo_pipe.benchmarks.call_decisions [--tasks 10] [--lead-in "Now {left}. "] [--model-path DIR] \\
        experiment=calculator_lengths "data.terms=[3,4]"

An agent that learned a template makes the same number of calls whatever the task (issue 58: two calls on every
arithmetic task, 0% on those that need three). Sampled accuracy says that it failed, not where. This command plays
the correct episode of each held-out arithmetic task through the experiment's own environment (its worked examples,
chat format, calculator and glue tokens: exactly the context the model meets), turn by turn: turn k calls the k-th
operation of one correct evaluation (products first, then left to right), and after the last result the turn
answers `#### <value>`. At the start of every model turn it reads, from one forward pass (fp32 transformers, no
sampling), the probability of going on with a call against that of going on with the answer, at the first token where
the two part: the turn's first token (`<calculator>` against `####`, or the first word of `--lead-in` where the
examples write something before each later call, e.g. `Now {left}. ` with `{left}` the expression still to compute),
or, with `--restate-answer` (the examples write the lead-in before the answer too: `Now 49. #### 49`), the token after
the lead-in.

It prints, per task length and per number of operations left, the mean share P(call) / (P(call) + P(answer)): with
operations left it should be near 1, with none left near 0. A template shows as a share that depends on how many
calls were made rather than on what is left. The figures are of the correct path only: a model that has gone wrong
earlier meets other contexts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from grpo_pipe.benchmarks.hf_engine import HFEngine
from grpo_pipe.benchmarks.trl_tools import EnvironmentWithTools
from grpo_pipe.config.errors import InputError
from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.runner.components import build
from grpo_pipe.types import Completion, RequestTelemetry, SamplingSettings, Task


@dataclass(frozen=True, kw_only=True)
class ScriptedTurn:
    """One model turn of a correct episode: what it writes, and the two ways it could go at that point.

    Args:
        text: What the turn writes (the call when operations are left, else the answer).
        call: What a call would write here (with the lead-in where the examples write one).
        answer: What an answer would write here.
        left: Operations still to run when the turn starts.
    """

    text: str
    call: str
    answer: str
    left: int


def correct_turns(question: str, tool: str, lead_in: str = "", restate_answer: bool = False) -> list[ScriptedTurn]:
    """The turns of one correct episode of `Calculate a op b op c ...`: one operation a call, every `*` first, then
    `+` and `-` left to right (the order of `data.arithmetic.steps`), then the answer. `lead_in` (with `{left}`, the
    expression still to compute) is written before every call but the first, as examples that restate it do; with
    `restate_answer` before the answer too (`Now 49. #### 49`), so the choice comes after what is left is written."""
    numbers, operators = _terms(question)
    turns, first = [], True
    while True:
        left = _expression(numbers, operators)
        words = "" if first else lead_in.format(left=left)
        at = _next_at(operators)
        operation = f"{numbers[at]} {operators[at]} {numbers[at + 1]}" if operators else left
        call = f"{words}<{tool}>{operation}</{tool}>"
        answer = f"{words if restate_answer else ''}#### {left}"
        turns.append(ScriptedTurn(text=call if operators else answer, call=call, answer=answer, left=len(operators)))
        if not operators:
            return turns
        a, op, b = numbers[at], operators[at], numbers[at + 1]
        numbers[at : at + 2] = [a * b if op == "*" else a + b if op == "+" else a - b]
        del operators[at]
        first = False


def _next_at(operators: Sequence[str]) -> int:
    """The operator computed next: the first `*`, else the first (0 also when none is left)."""
    return operators.index("*") if "*" in operators else 0


def _terms(question: str) -> tuple[list[int], list[str]]:
    pieces = question.split("Calculate", 1)[-1].strip().rstrip(".").split()
    try:
        numbers, operators = [int(p) for p in pieces[0::2]], pieces[1::2]
    except ValueError:
        numbers, operators = [], []
    if not numbers or len(numbers) != len(operators) + 1 or not set(operators) <= {"+", "-", "*"}:
        raise InputError([f"call_decisions reads arithmetic tasks ('Calculate 14 + 3 * 25.'); got {question!r}"])
    return numbers, operators


def _expression(numbers: Sequence[int], operators: Sequence[str]) -> str:
    return " ".join([*(f"{n} {op}" for n, op in zip(numbers, operators)), str(numbers[-1])])


@dataclass(frozen=True, kw_only=True)
class Reading:
    """The model's choice at the start of one turn of a correct episode.

    Args:
        prompt: The task's prompt tokens (which task).
        left: Operations still to run.
        share: P(call) / (P(call) + P(answer)) at the first token where the two ways of going on part.
        mass: P(call) + P(answer).
    """

    prompt: tuple[int, ...]
    left: int
    share: float
    mass: float


class ForcedEngine(HFEngine):
    """Plays scripted turns instead of generating, and reads at the start of each turn the model's probability of
    starting a call against that of starting an answer (see the module's docstring).

    Args:
        scripts: Each task's correct turns, keyed by the task's prompt tokens (an episode's contexts start with them).
    """

    def __init__(self, scripts: dict[tuple[int, ...], list[ScriptedTurn]]) -> None:
        super().__init__(batch_size=16)
        self.scripts = scripts  # keyed by the task's prompt tokens
        self.readings: list[Reading] = []

    def generate(self, prompts: Sequence[Sequence[int]], samples: Sequence[int],
                 sampling: SamplingSettings) -> list[list[Completion]]:
        contexts = [tuple(p) for p in prompts]
        turns = [self._turn_of(context) for context in contexts]
        shares = self._call_shares(contexts, turns)
        out = []
        for context, (key, turn), (share, mass) in zip(contexts, turns, shares):
            self.readings.append(Reading(prompt=key, left=turn.left, share=share, mass=mass))
            tokens = tuple(self._tokenizer(turn.text, add_special_tokens=False)["input_ids"])
            telemetry = RequestTelemetry(prompt_tokens=len(context), generated_tokens=len(tokens), cached_prompt_tokens=0)
            out.append([Completion(token_ids=tokens, logprobs=(0.0,) * len(tokens), text=turn.text,
                                   finish_reason="stop", policy_version=0, telemetry=telemetry)])
        return out

    def _turn_of(self, context: tuple[int, ...]) -> tuple[tuple[int, ...], ScriptedTurn]:
        """The task whose prompt starts this context, and its turn by the number of calls made so far."""
        for key, script in self.scripts.items():
            if context[: len(key)] == key:
                made = sum(1 for r in self.readings if r.prompt == key)
                return key, script[made]
        raise RuntimeError("a context that starts with no scripted task's prompt")

    def _call_shares(self, contexts: list[tuple[int, ...]],
                     turns: list[tuple[tuple[int, ...], ScriptedTurn]]) -> list[tuple[float, float]]:
        """Per context: P(call) / (P(call) + P(answer)), and P(call) + P(answer), at the first token where the two
        ways of going on part (the turn's first token, or the one after a lead-in both write)."""
        forced, choices = [], []
        for context, (_, turn) in zip(contexts, turns):
            call, answer = (self._tokenizer(t, add_special_tokens=False)["input_ids"] for t in (turn.call, turn.answer))
            shared = next(i for i, (c, a) in enumerate(zip(call, answer)) if c != a)
            forced.append(context + tuple(call[:shared]))
            choices.append((call[shared], answer[shared]))
        shares: list[tuple[float, float]] = []
        for start in range(0, len(forced), self.batch_size):
            probabilities = self._next_token_probabilities(forced[start : start + self.batch_size])  # [B, vocabulary]
            for row, (call, answer) in zip(probabilities, choices[start : start + self.batch_size]):
                shares.append((float(row[call] / (row[call] + row[answer])), float(row[call] + row[answer])))
        return shares

    def _next_token_probabilities(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        tokenizer, model = self._tokenizer, self._loaded()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        width = max(len(c) for c in contexts)
        ids = torch.tensor([[pad] * (width - len(c)) + list(c) for c in contexts], device=self.device)
        mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: each context's positions start at 0
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        return torch.softmax(logits.float(), dim=-1)


def summarize(tasks: Sequence[Task], prompts: Sequence[tuple[int, ...]],
              readings: Sequence[Reading]) -> dict[str, dict[str, float]]:
    """Mean share of calling per task length (`terms_N`) and operations left (`left_K`), and the mean probability
    the two first tokens hold together (`mass`: near 1 when the model starts its turn one way or the other)."""
    length_of = {prompt: int(task.metadata["operations"]) + 1 for task, prompt in zip(tasks, prompts)}
    cells: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for reading in readings:
        row = cells[f"terms_{length_of[reading.prompt]}"]
        row[f"left_{reading.left}"].append(reading.share)
        row["mass"].append(reading.mass)
    return {length: {left: statistics.fmean(v) for left, v in sorted(row.items(), reverse=True)}
            for length, row in sorted(cells.items())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10, help="held-out tasks per length")
    parser.add_argument("--lead-in", default="", help="what the examples write before each later call ({left}: the "
                        "expression still to compute), e.g. 'Now {left}. '; empty: a call starts with its tag")
    parser.add_argument("--restate-answer", action="store_true",
                        help="the lead-in is also written before the answer ('Now 49. #### 49'), as the examples do")
    parser.add_argument("--model-path", type=Path, default=None, help="a trained snapshot; default: the config's model")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("overrides", nargs="*", help="config overrides, as on the grpo_pipe command line")
    args = parser.parse_args(argv)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*args.overrides, "logger=none"])
    parts = build(cfg)
    environment = parts.environment
    if not isinstance(environment, EnvironmentWithTools):
        raise InputError(["call_decisions needs episodes with tools (environment=calculator or an experiment built on it)"])
    model_path = args.model_path or parts.model.materialize()
    environment.setup(AutoTokenizer.from_pretrained(model_path), parts.data.system_prompt, int(cfg.rollout.max_model_len))
    tool = environment.tools[0].name
    tasks = _per_length(list(parts.data.eval_tasks()), args.tasks)
    prompts = [environment.render_prompt(t) for t in tasks]
    scripts = {p: correct_turns(t.question, tool, args.lead_in, args.restate_answer) for t, p in zip(tasks, prompts)}
    engine = ForcedEngine(scripts)
    engine.connect(model_path)
    sampling = SamplingSettings(temperature=0.0, max_tokens=int(cfg.run.eval_max_new_tokens))
    try:
        played = [c[0] for c in environment.generate(engine, tasks, prompts, [1] * len(tasks), sampling)]
    finally:
        engine.shutdown()
    figures = summarize(tasks, prompts, engine.readings)
    cut = [t.uid for t, c in zip(tasks, played) if c.episode is None or c.episode.ended_by != "answer"]
    print(f"P(call) / (P(call) + P(answer)) at the start of each turn of a correct episode ({model_path})")
    for length, row in figures.items():
        print(f"  {length}: " + "  ".join(f"{left} {share:.3f}" for left, share in row.items()))
    if cut:  # the environment's limits (turns, tokens) ended these before their answer: their later turns are missing
        print(f"  {len(cut)} episodes ended before their answer: {', '.join(cut)}")
    if args.json:
        args.json.write_text(json.dumps({"overrides": args.overrides, "lead_in": args.lead_in,
                                         "restate_answer": args.restate_answer, "figures": figures, "cut": cut,
                                         "episodes": _first_of_each_length(tasks, played)}, indent=1))
    return 0


def _first_of_each_length(tasks: Sequence[Task], played: Sequence[Completion]) -> dict[str, dict[str, Any]]:
    """One played episode per length, turn by turn, for a reader to see what the model was shown."""
    shown: dict[str, dict[str, Any]] = {}
    for task, completion in zip(tasks, played):
        length = f"terms_{int(task.metadata['operations']) + 1}"
        if length not in shown and completion.episode is not None:
            turns = [{"role": t.role, "text": t.text} for t in completion.episode.turns]
            shown[length] = {"question": task.question, "turns": turns}
    return shown


def _per_length(tasks: list[Task], count: int) -> list[Task]:
    kept: dict[int, list[Task]] = defaultdict(list)
    for task in tasks:
        if len(kept[int(task.metadata["operations"])]) < count:
            kept[int(task.metadata["operations"])].append(task)
    return [t for length in sorted(kept) for t in kept[length]]


if __name__ == "__main__":
    raise SystemExit(main())
