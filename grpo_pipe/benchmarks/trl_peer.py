"""The peer for the quality-per-second comparison: the same model trained on the same prompts by TRL 1.16's
`GRPOTrainer` (vLLM colocate), under a budget of training wall-clock, with bf16 weight snapshots saved at
fixed marks of that clock so another module grades every snapshot the same way as our own pipeline's.

    run = train_trl(model_path, prompts, answers, settings, budget_s=300.0, mark_every_s=60.0, out_dir=out)

The clock (`trl_clock.WallClockBudget`) starts when the first optimizer step starts (model load and vLLM start-up
are `startup_s`) and stops while a snapshot is written; snapshots are taken at 0 s, at each mark and at the end.

Set to match our pipeline (`PeerSettings`): lr and the `constant_with_warmup` schedule, prompts per step and
samples per prompt, completion length, temperature, top_p, the clip range (`epsilon`, `epsilon_high`),
gradient clipping, micro-batch size (gradient accumulation fills the step: one optimizer update per generation
batch, TRL's `steps_per_generation == gradient_accumulation_steps`), KL coefficient, seed, gradient
checkpointing off (TRL's own default is on), bf16 autocast on GPU only, no logging to outside services.
Prompts arrive rendered with the chat template and are passed as plain text; TRL 1.16 tokenizes plain text
with the tokenizer's default special tokens, so the tokenizer TRL gets adds none (no second BOS).

With `tools` (a `trl_tools.ToolPeer`: the job's episodes have tools), prompts arrive as messages and TRL runs its
own tool loop (`GRPOTrainer(tools=...)`): the tool chat template and response template are set on the tokenizer TRL
gets, `max_new_tokens` is the whole episode's budget (`max_completion_length`: model and tool tokens together),
`max_turn_tokens` caps each model turn (`generation_kwargs`), and `max_tool_calling_iterations` is the number of tool
rounds (our `max_turns` - 1). `trl_tools` says where TRL's episode differs from ours.

Kept at TRL's defaults (they differ from ours where noted): policy loaded in float32 (`model_init_kwargs`),
`loss_type="dapo"` (token-level mean; our default loss is sequence-mean GRPO), `scale_rewards="group"`,
`num_iterations=1` (the ratio is taken against the current policy), the engine's log-probs entering only through
`vllm_importance_sampling_correction` (mode `sequence_mask`, cap 3.0; ours truncates per token at 2.0),
`mask_truncated_completions=False`, AdamW with weight decay 0 and betas (0.9, `adam_beta2`=0.999, as our
`optimizer=adamw`), shuffled prompts (TRL's own sampler), vLLM sampling seed 0 and sleep mode off,
vLLM's dtype read from the model's config (`dtype="auto"`: TRL passes no dtype to vLLM).
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer
from transformers.trainer_callback import PrinterCallback

from grpo_pipe.benchmarks.trl_clock import Snapshot, WallClockBudget, snapshot_writer
from grpo_pipe.benchmarks.trl_tools import ToolPeer, final_answer
from grpo_pipe.config.errors import ConfigError
from grpo_pipe.rewards.answers import is_correct

log = logging.getLogger(__name__)

_UNBOUNDED_STEPS = 1_000_000_000  # the wall-clock budget ends training, never the step count
_DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass(frozen=True, kw_only=True)
class PeerSettings:
    """TRL's hyper-parameters; the first block must be given the values of the run it is compared with.

    Args:
        lr: The learning rate.
        warmup_steps: Optimizer updates of linear warmup, then constant (`constant_with_warmup`).
        prompts_per_step: Prompts in one optimizer step's batch.
        samples_per_prompt: The GRPO group size (TRL's `num_generations`).
        max_new_tokens: Tokens per completion.
        temperature: The sampling temperature.
        top_p: The sampling nucleus.
        clip_low: TRL's `epsilon`: ratios below 1 - clip_low are clipped.
        clip_high: TRL's `epsilon_high`: ratios above 1 + clip_high are clipped.
        grad_clip: The gradients' total norm is clipped to this.
        micro_batch_size: Completions per forward/backward; must divide prompts_per_step * samples_per_prompt.
        seed: TRL's seed.
        beta: KL coefficient; 0 = no reference model.
        loss_type: TRL's loss aggregation.
        dtype: The dtype of the policy's weights; bf16 autocast on GPU comes on top.
        gradient_checkpointing: Recompute activations in the backward pass instead of keeping them.
        adam_beta2: AdamW's second-moment decay.
        use_vllm: False: TRL generates with transformers' `generate` (slow; for CPU tests).
        vllm_gpu_memory_utilization: The engine's share of the GPU beside the trainer.
        max_turn_tokens: Tool episodes: tokens of one model turn (None: the whole completion's).
        max_tool_calling_iterations: Tool episodes: rounds of calls (None: TRL's default, no limit).
    """

    lr: float
    warmup_steps: int
    prompts_per_step: int
    samples_per_prompt: int
    max_new_tokens: int
    temperature: float
    top_p: float
    clip_low: float
    clip_high: float
    grad_clip: float
    micro_batch_size: int
    seed: int
    beta: float = 0.0
    loss_type: str = "dapo"  # TRL's default
    dtype: str = "float32"  # TRL's default
    gradient_checkpointing: bool = False
    adam_beta2: float = 0.999  # TRL's (and transformers') default
    use_vllm: bool = True
    vllm_gpu_memory_utilization: float = 0.3  # TRL's default
    max_turn_tokens: int | None = None
    max_tool_calling_iterations: int | None = None


@dataclass(frozen=True, kw_only=True)
class PeerRun:
    """What one TRL run left: its snapshots, and the reward and log of each step.

    Args:
        snapshots: The first at 0 s (the starting weights), then one per mark, then the end.
        step_rewards: Mean training reward of each optimizer step, from TRL's logs.
        steps: Optimizer steps done.
        train_s: Training wall-clock (snapshot writing excluded).
        startup_s: From the call to the first step's start (model load, vLLM start-up).
        step_logs: TRL's log of each step (`tools/call_frequency`...).
    """

    snapshots: list[Snapshot]
    step_rewards: list[float]
    steps: int
    train_s: float
    startup_s: float
    step_logs: list[dict[str, float]] = field(default_factory=list)


def correctness_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """Our `reward=correctness` in TRL's reward shape: 1.0 when the final answer equals the reference."""
    return [1.0 if is_correct(completion_text(c), reference) is True else 0.0 for c, reference in zip(completions, answer)]


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """What a checker grades: the text of a plain completion, the final answer of a tool episode's messages."""
    return completion if isinstance(completion, str) else final_answer(completion)


def train_trl(
    model_path: Path,
    prompts: list[str] | list[list[dict[str, str]]],
    answers: list[str],
    settings: PeerSettings,
    budget_s: float,
    mark_every_s: float,
    out_dir: Path,
    reward_fn: Callable[..., list[float]] = correctness_reward,
    tools: ToolPeer | None = None,
) -> PeerRun:
    """Train `model_path` with TRL's GRPOTrainer until `budget_s` seconds of training; see the module docstring.

    `reward_fn` has TRL's reward shape; besides `answer` it receives `task_index`, the position of each
    completion's prompt in `prompts` (so a caller can score with its own tasks). With `tools`, `prompts` are messages
    and the completions `reward_fn` receives are message lists (`completion_text` reads the answer)."""
    called = time.perf_counter()
    _check_arguments(prompts, answers, settings, budget_s, mark_every_s, tools)
    datasets, trl = _import_trl()
    tokenizer, longest = _processing_class(model_path, prompts, tools)
    budget = WallClockBudget(
        save=snapshot_writer(AutoTokenizer.from_pretrained(model_path)),  # the unaltered tokenizer goes in snapshots
        out_dir=out_dir,
        budget_s=budget_s,
        mark_every_s=mark_every_s,
        called=called,
    )
    with _environment_restored():  # vLLM's colocate start sets RANK, WORLD_SIZE, VLLM_ENABLE_V1_MULTIPROCESSING=0
        trainer = trl.GRPOTrainer(
            model=str(model_path),
            reward_funcs=reward_fn,
            args=_grpo_config(trl, settings, out_dir, max_model_len=longest + settings.max_new_tokens),
            train_dataset=datasets.Dataset.from_dict(
                {"prompt": prompts, "answer": answers, "task_index": list(range(len(prompts)))}),
            processing_class=tokenizer,
            callbacks=[budget],
            tools=tools.functions if tools is not None else None,
        )
        trainer.remove_callback(PrinterCallback)  # it prints every log dict; the figures come back in PeerRun
        try:
            trainer.train()
        finally:
            _release(trainer, settings.use_vllm)
    logs = [{k: float(v) for k, v in entry.items() if isinstance(v, (int, float))}
            for entry in trainer.state.log_history if "reward" in entry]
    return PeerRun(
        snapshots=list(budget.snapshots),
        step_rewards=[entry["reward"] for entry in logs],
        steps=trainer.state.global_step,
        train_s=budget.last_step_s,
        startup_s=budget.startup_s,
        step_logs=logs,
    )


def _check_arguments(
    prompts: list[str] | list[list[dict[str, str]]], answers: list[str], settings: PeerSettings, budget_s: float,
    mark_every_s: float, tools: ToolPeer | None,
) -> None:
    """Every problem at once, naming the argument and its value."""
    batch = settings.prompts_per_step * settings.samples_per_prompt
    as_messages = all(isinstance(p, list) for p in prompts)
    problems = [
        f"{name}={value}: {rule}"
        for name, value, ok, rule in [
            ("len(answers)", len(answers), len(answers) == len(prompts), f"must equal len(prompts)={len(prompts)}"),
            ("len(prompts)", len(prompts), len(prompts) >= settings.prompts_per_step,
             f"must be at least prompts_per_step={settings.prompts_per_step}"),
            ("samples_per_prompt", settings.samples_per_prompt, settings.samples_per_prompt >= 2, "GRPO needs >= 2"),
            ("micro_batch_size", settings.micro_batch_size,
             settings.micro_batch_size > 0 and batch % settings.micro_batch_size == 0,
             f"must divide prompts_per_step * samples_per_prompt = {batch}"),
            ("dtype", settings.dtype, settings.dtype in _DTYPES, f"must be one of {_DTYPES}"),
            ("budget_s", budget_s, budget_s > 0, "must be > 0"),
            ("mark_every_s", mark_every_s, mark_every_s > 0, "must be > 0"),
            ("prompts", "messages" if as_messages else "text", as_messages == (tools is not None),
             "must be messages exactly when tools are given (TRL renders tool prompts itself)"),
            ("max_turn_tokens", settings.max_turn_tokens, settings.max_turn_tokens is None or tools is not None,
             "caps the turns of tool episodes: needs tools"),
        ]
        if not ok
    ]
    if problems:
        raise ConfigError([f"train_trl: {problem}" for problem in problems])


def _import_trl() -> tuple[Any, Any]:
    """`datasets` and `trl`, which the package does not depend on (the `peer` extra brings them); imported by
    name so the type checker passes on machines without them."""
    try:
        datasets, trl = importlib.import_module("datasets"), importlib.import_module("trl")
    except ImportError as err:
        raise ImportError(f"the TRL peer needs TRL: pip install trl==1.16.0 ({err})") from err
    if trl.__version__ != "1.16.0":
        log.warning("trl %s is installed; the peer was written and checked against trl 1.16.0", trl.__version__)
    return datasets, trl


def _processing_class(model_path: Path, prompts: list[str] | list[list[dict[str, str]]],
                      tools: ToolPeer | None) -> tuple[Any, int]:
    """The tokenizer TRL gets, and the longest prompt in tokens (vLLM's context must hold it and a completion)."""
    if tools is not None:
        tokenizer = tools.tokenizer(model_path)
        conversations = [p for p in prompts if isinstance(p, list)]
        return tokenizer, max(len(ids) for ids in tools.prompt_ids(tokenizer, conversations))
    texts = [p for p in prompts if isinstance(p, str)]
    tokenizer = _plain_text_tokenizer(model_path, texts)
    return tokenizer, max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def _plain_text_tokenizer(model_path: Path, prompts: list[str]) -> Any:
    """A tokenizer that adds no special tokens by default: the prompts already carry the template's own (BOS).

    TRL 1.16 tokenizes a plain-text prompt as `processing_class(text=prompts)`, with the tokenizer's default
    `add_special_tokens=True`; a tokenizer that prepends BOS (Llama style) would put a second one in front.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def adds_tokens() -> bool:
        return tokenizer(prompts)["input_ids"] != tokenizer(prompts, add_special_tokens=False)["input_ids"]

    if adds_tokens():
        tokenizer.add_bos_token = False  # transformers 5: the setters rebuild the post-processor without them
        tokenizer.add_eos_token = False
        if adds_tokens():
            raise RuntimeError(f"the tokenizer of {model_path} adds special tokens to plain text and cannot be told not to")
    return tokenizer


def _grpo_config(trl: Any, settings: PeerSettings, out_dir: Path, max_model_len: int) -> Any:
    """TRL's config: our hyper-parameters, TRL's defaults for the rest, the wall clock as the only end."""
    batch = settings.prompts_per_step * settings.samples_per_prompt
    return trl.GRPOConfig(
        output_dir=str(out_dir / "trl"),
        learning_rate=settings.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=settings.warmup_steps,
        adam_beta2=settings.adam_beta2,
        per_device_train_batch_size=settings.micro_batch_size,
        gradient_accumulation_steps=batch // settings.micro_batch_size,  # one update per generation batch
        num_generations=settings.samples_per_prompt,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        epsilon=settings.clip_low,
        epsilon_high=settings.clip_high,
        max_grad_norm=settings.grad_clip,
        beta=settings.beta,
        loss_type=settings.loss_type,
        seed=settings.seed,
        model_init_kwargs={"dtype": settings.dtype},
        gradient_checkpointing=settings.gradient_checkpointing,
        bf16=torch.cuda.is_available(),
        use_vllm=settings.use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
        vllm_max_model_length=max_model_len,
        max_tool_calling_iterations=settings.max_tool_calling_iterations,
        generation_kwargs=_turn_limit(settings),
        max_steps=_UNBOUNDED_STEPS,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        push_to_hub=False,
        disable_tqdm=True,
    )


def _turn_limit(settings: PeerSettings) -> dict[str, int] | None:
    """A cap on each model turn, in the generation backend's own key (vLLM's sampling params or transformers')."""
    if settings.max_turn_tokens is None:
        return None
    return {"max_tokens" if settings.use_vllm else "max_new_tokens": settings.max_turn_tokens}


@contextmanager
def _environment_restored() -> Iterator[None]:
    """Put os.environ back as it was, so what TRL and vLLM set for colocate does not leak into later engines."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


def _release(trainer: Any, used_vllm: bool) -> None:
    """Free the colocated engine and the process group vLLM's external launcher started."""
    if used_vllm:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        trainer.vllm_generation.llm = None
        cleanup_dist_env_and_memory()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
