"""Benchmark: held-out accuracy against training wall-clock time (and against step), optionally beside TRL.

    python -m grpo_pipe.benchmarks.learning --minutes 5 --mark-every 1 [--peer trl] experiment=arithmetic_30min ...

Our job runs its own recipe step by step under a training-time budget; at each mark (and at the end) the
policy's weights are written to a snapshot folder, with the clock stopped while it writes. With `--peer trl`,
TRL's `GRPOTrainer` then trains the same model on the same rendered prompts with the same checker and
hyper-parameters under the same budget, scored by the job's own reward (`grpo_pipe.benchmarks.trl_peer`;
`pip install trl==1.16.0`).
Every snapshot of both is graded afterwards by one grader: greedy decoding with transformers in fp32,
`run.eval_max_new_tokens` tokens, the job's own reward deciding what counts as correct, on the first
`--grade-size` held-out tasks. So the two curves differ only in how each tool trained. When the job's episodes have
tools (`environment=tools` or an option built on it, e.g. `environment=calculator`), grading runs those episodes (the
same prompts, call format, tools and limits) on a transformers engine (`hf_engine`), and TRL trains with its own tool
loop on the same task (`trl_tools`). The first and last snapshot of each tool are also graded sampled (temperature 1,
`--sampled-k` samples per task; the mean correctness over samples).

"Training time" starts at the first step (engine start-up, model loading and compilation excluded, as a user
sees start-up once per job) and includes generation, scoring, the update and the weight sync.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from grpo_pipe.benchmarks.curves import Curve, Marks, Snapshot, minutes_to_reach
from grpo_pipe.benchmarks.hf_engine import HFEngine
from grpo_pipe.benchmarks.trl_job import render_text, scored_completion, train_peer
from grpo_pipe.benchmarks.trl_tools import EnvironmentWithTools
from grpo_pipe.config.errors import InputError
from grpo_pipe.config.sources import CONF_DIR
from grpo_pipe.evaluation.by_group import group_metrics
from grpo_pipe.interfaces import Environment, Reward
from grpo_pipe.runner.components import Components, build
from grpo_pipe.runner.recipe import GRPORecipe
from grpo_pipe.types import Completion, RewardOutput, RolloutGroup, SamplingSettings, Task

log = logging.getLogger(__name__)


def train_ours(parts: Components, cfg: DictConfig, budget_s: float, every_s: float, out: Path,
               max_steps: int | None = None) -> Curve:
    """Our recipe under the budget, a snapshot of the policy at each mark (clock stopped while writing)."""
    started = time.perf_counter()
    recipe = GRPORecipe(parts=parts, config_yaml=OmegaConf.to_yaml(cfg), output_dir=out)
    try:
        recipe.setup()
        write = snapshot_writer(parts, out / "ours")
        snapshots, step_metrics = [write(0.0, 0)], []
        startup_s, marks, train_s = time.perf_counter() - started, Marks(budget_s, every_s), 0.0
        last = min(parts.trainer.steps, max_steps or parts.trainer.steps)
        for step in range(1, last + 1):
            began = time.perf_counter()
            step_metrics.append(recipe.train_step(step))
            train_s += time.perf_counter() - began
            done = marks.over(train_s) or step == last
            if done or marks.due(train_s):
                snapshots.append(write(train_s, step))
            if done:
                break
            log.info("ours: step %d at %.0f s, reward %.3f", step, train_s, step_metrics[-1]["train/reward/mean"])
    finally:
        recipe.cleanup()
    rewards = [m["train/reward/mean"] for m in step_metrics]
    return Curve(tool="grpo_pipe", snapshots=snapshots, step_rewards=rewards, train_s=train_s, startup_s=startup_s,
                 step_metrics=step_metrics, samples=list(recipe.recorder.table))


def snapshot_writer(parts: Components, folder: Path) -> Callable[[float, int], Snapshot]:
    """Writes the policy's weights with the model source's tokenizer files, into a new folder per snapshot."""

    def write(train_s: float, step: int) -> Snapshot:
        path = folder / f"snapshot-{len(list(folder.glob('snapshot-*'))) if folder.exists() else 0}"
        parts.trainer.policy.save_pretrained(path)
        parts.model.copy_tokenizer(path)
        return Snapshot(train_s, step, path)

    return write


def grade(model_path: Path, tasks: Sequence[Task], prompts: Sequence[Sequence[int]], reward: Reward,
          max_new_tokens: int, batch_size: int = 64) -> float:
    """Held-out accuracy of one snapshot: greedy transformers decoding in fp32, judged by `reward`'s `correct`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model = model.to(device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, top_p=None, top_k=None, temperature=None)
        texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    del model
    return accuracy_of(tasks, prompts, texts, reward)


def accuracy_of(tasks: Sequence[Task], prompts: Sequence[Sequence[int]], texts: Sequence[str], reward: Reward) -> float:
    groups = [RolloutGroup(task, tuple(prompt), (scored_completion(text),)) for task, prompt, text in zip(tasks, prompts, texts)]
    return fraction_correct(reward(groups))


def fraction_correct(scored: RewardOutput) -> float:
    if scored.correct is None:
        raise InputError(["reward: the learning benchmark grades by the reward's `correct` flags; this reward gives none"])
    return sum(scored.correct) / max(len(scored.correct), 1)


@dataclass(frozen=True, kw_only=True)
class Grader:
    """One grader for every snapshot of both tools: the held-out tasks, their prompt ids, the job's reward, and the
    job's episodes with tools (None: one turn per task, greedy figures from `grade` as before environment).

    Args:
        tasks: The held-out tasks.
        prompts: Each task's prompt token ids.
        reward: The job's reward, which scores the completions.
        max_new_tokens: Tokens per model turn.
        environment: The job's environment with tools; None: one turn per task.
        sampled_k: Samples per task for the sampled figure (0: none).
        seed: The sampling seed of the sampled figure.
    """

    tasks: list[Task]
    prompts: list[tuple[int, ...]]
    reward: Reward
    max_new_tokens: int
    environment: EnvironmentWithTools | None
    sampled_k: int
    seed: int

    def greedy(self, model_path: Path) -> float:
        return self.greedy_with_groups(model_path)[0]

    def greedy_with_groups(self, model_path: Path) -> tuple[float, dict[str, float]]:
        """Greedy accuracy, and the held-out metrics per group of tasks (per length: `eval/accuracy/terms_3`, ...,
        and `eval/calls_match`) where the tasks name their group, as the job's own evaluation reports them."""
        if self.environment is None:
            return grade(model_path, self.tasks, self.prompts, self.reward, self.max_new_tokens), {}
        sampling = SamplingSettings(temperature=0.0, max_tokens=self.max_new_tokens)
        completions, scored = self._scored(model_path, 1, sampling)
        firsts = [c[0] for c in completions]
        return fraction_correct(scored), group_metrics(self.tasks, firsts, scored)

    def sampled(self, model_path: Path) -> float:
        """Mean correctness of `sampled_k` samples per task at temperature 1."""
        sampling = SamplingSettings(temperature=1.0, top_p=1.0, max_tokens=self.max_new_tokens, seed=self.seed)
        return self._accuracy(model_path, self.sampled_k, sampling)

    def _accuracy(self, model_path: Path, samples: int, sampling: SamplingSettings) -> float:
        return fraction_correct(self._scored(model_path, samples, sampling)[1])

    def _scored(self, model_path: Path, samples: int,
                sampling: SamplingSettings) -> tuple[list[list[Completion]], RewardOutput]:
        engine = HFEngine()
        engine.connect(model_path)
        counts = [samples] * len(self.tasks)
        try:
            completions = (engine.generate(self.prompts, counts, sampling) if self.environment is None
                           else self.environment.generate(engine, self.tasks, self.prompts, counts, sampling))
        finally:
            engine.shutdown()
        groups = [RolloutGroup(t, p, tuple(c)) for t, p, c in zip(self.tasks, self.prompts, completions)]
        return [list(c) for c in completions], self.reward(groups)


def grade_curve(curve: Curve, grader: Grader) -> None:
    """Greedy accuracy of every snapshot; sampled accuracy of the first and the last."""
    last = len(curve.snapshots) - 1
    for index, snapshot in enumerate(curve.snapshots):
        accuracy, by_group = grader.greedy_with_groups(snapshot.path)
        curve.accuracy.append(accuracy)
        curve.by_group.append(by_group)
        sampled = ""
        if grader.sampled_k > 0 and index in (0, last):
            curve.sampled[index] = grader.sampled(snapshot.path)
            sampled = f"  sampled ({grader.sampled_k} per task) {curve.sampled[index]:.3f}"
        print(f"{curve.tool:>9}  {snapshot.train_s / 60:5.2f} min  step {snapshot.step:4d}  "
              f"held-out accuracy {curve.accuracy[-1]:.3f}{sampled}", flush=True)
        if by_group:
            print("           " + "  ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in sorted(by_group.items())
                                           if not k.startswith("eval/reward/")), flush=True)


def held_out(parts: Components, model_path: Path, size: int) -> tuple[list[Task], list[tuple[int, ...]], list[str]]:
    """The first `size` held-out tasks, their prompt ids and texts, rendered with the model's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tasks = list(parts.data.eval_tasks())[:size]
    texts = [render_text(tokenizer, parts.data.system_prompt, t) for t in tasks]
    return tasks, [tuple(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts], texts


def make_grader(parts: Components, environment: Environment, cfg: DictConfig, model_path: Path, size: int,
                sampled_k: int) -> Grader:
    """The grader of this job; `environment` is one of its own (a run closes the one it used)."""
    from transformers import AutoTokenizer

    if not isinstance(environment, EnvironmentWithTools):
        tasks, prompts, _ = held_out(parts, model_path, size)
        return Grader(tasks=tasks, prompts=prompts, reward=parts.reward, max_new_tokens=int(cfg.run.eval_max_new_tokens),
                      environment=None, sampled_k=sampled_k, seed=int(cfg.run.seed))
    environment.setup(AutoTokenizer.from_pretrained(model_path), parts.data.system_prompt, int(cfg.rollout.max_model_len))
    tasks = list(parts.data.eval_tasks())[:size]
    prompts = [environment.render_prompt(t) for t in tasks]
    return Grader(tasks=tasks, prompts=prompts, reward=parts.reward, max_new_tokens=int(cfg.run.eval_max_new_tokens),
                  environment=environment, sampled_k=sampled_k, seed=int(cfg.run.seed))


def report(curves: Sequence[Curve], budget_s: float) -> dict[str, Any]:
    """Print accuracy against minutes and against steps, the early training reward, and where each curve
    reaches the other's final accuracy; return it all as one dict."""
    summary: dict[str, Any] = {}
    for curve in curves:
        early, last = curve.step_rewards[:20], len(curve.snapshots) - 1
        row = {
            "steps": curve.steps, "train_s": curve.train_s, "startup_s": curve.startup_s,
            "s_per_step": curve.train_s / max(curve.steps, 1),
            "final_accuracy": curve.accuracy[-1] if curve.accuracy else None,
            "sampled_accuracy_first": curve.sampled.get(0), "sampled_accuracy_last": curve.sampled.get(last),
            "reward_steps_1_10": _mean(curve.step_rewards[:10]), "reward_steps_11_20": _mean(early[10:20]),
            "reward_by_10_steps": [_mean(curve.step_rewards[i : i + 10]) for i in range(0, curve.steps, 10)],
            "curve": [{"minutes": s.train_s / 60, "step": s.step, "accuracy": a, **groups}
                      for s, a, groups in zip(curve.snapshots, curve.accuracy, curve.by_group)],
        }
        summary[curve.tool] = row
        print(f"\n{curve.tool}: {row['steps']} steps in {curve.train_s / 60:.2f} min of training "
              f"({row['s_per_step']:.2f} s/step; start-up {curve.startup_s:.0f} s); "
              f"held-out accuracy at the end {row['final_accuracy']:.3f}")
        if curve.sampled:
            print(f"  sampled accuracy: first snapshot {row['sampled_accuracy_first']:.3f}, "
                  f"last {row['sampled_accuracy_last']:.3f}")
        print("  reward per 10 steps: " + ", ".join(f"{r:.2f}" for r in row["reward_by_10_steps"][:30]))
    if len(curves) == 2:
        ours, peer = curves
        for a, b in ((ours, peer), (peer, ours)):
            reached = minutes_to_reach(a, b.accuracy[-1]) if b.accuracy else None
            summary[f"{a.tool}_minutes_to_{b.tool}_final"] = reached
            print(f"{a.tool} reaches {b.tool}'s final accuracy ({b.accuracy[-1]:.3f}) after "
                  + (f"{reached:.2f} min" if reached is not None else f"more than {budget_s / 60:.1f} min"))
    return summary


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0, help="training wall-clock budget of each tool")
    parser.add_argument("--mark-every", type=float, default=1.0, help="minutes of training between snapshots")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="also stop our job after this many steps (an ablation at equal steps)")
    parser.add_argument("--grade-size", type=int, default=None, help="held-out tasks graded (default run.eval_size)")
    parser.add_argument("--sampled-k", type=int, default=4,
                        help="samples per task (temperature 1) graded on the first and last snapshot; 0: greedy only")
    parser.add_argument("--peer", choices=["trl"], default=None, help="also train TRL's GRPOTrainer the same way")
    parser.add_argument("--only-peer", action="store_true", help="train the peer alone (e.g. in a second process)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--keep", type=Path, default=None, help="write snapshots here instead of a temporary folder")
    parser.add_argument("overrides", nargs="*", help="config overrides, as on the grpo_pipe command line")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("vllm", "transformers", "httpx", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Every in-place reload makes vLLM list the layers it restores itself (rotary cache, tied head).
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*args.overrides, "logger=none", "checkpoint.every=0"])
    budget_s, every_s = 60.0 * args.minutes, 60.0 * args.mark_every
    with tempfile.TemporaryDirectory(prefix="grpo_pipe-learning-") as scratch:
        out = args.keep or Path(scratch)
        parts = build(cfg)
        model_path = parts.model.materialize()
        curves = [] if args.only_peer else [train_ours(parts, cfg, budget_s, every_s, out, args.max_steps)]
        if args.peer or args.only_peer:
            curves.append(train_peer(build(cfg), cfg, model_path, budget_s, every_s, out))
        size = args.grade_size or int(cfg.run.eval_size)
        grader = make_grader(parts, build(cfg).environment, cfg, model_path, size, args.sampled_k)
        how = "one turn" if grader.environment is None else "episodes with tools"
        print(f"\nGrading every snapshot on {len(grader.tasks)} held-out tasks ({how}, greedy, fp32 transformers, "
              f"{cfg.run.eval_max_new_tokens} new tokens per turn)", flush=True)
        for curve in curves:
            grade_curve(curve, grader)
        summary = report(curves, budget_s)
    if args.json:
        payload = {"overrides": args.overrides, "minutes": args.minutes, "summary": summary,
                   "step_metrics": {c.tool: c.step_metrics for c in curves},
                   "samples": {c.tool: c.samples for c in curves},
                   "snapshots": {c.tool: [asdict(s) | {"path": str(s.path)} for s in c.snapshots] for c in curves}}
        args.json.write_text(json.dumps(payload, indent=2, default=str))


if __name__ == "__main__":
    main()
