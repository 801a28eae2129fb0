"""A `RolloutEngine` over a plain transformers model, for grading: the same episodes our jobs run on vLLM, decoded by
one engine for every snapshot of every tool, so two tools' figures differ only in their weights.

It keeps vLLM's contract where an environment relies on it:
- `temperature` 0 is greedy; above 0 it samples (top-p, no top-k), seeded from `sampling.seed` when one is given.
- each prompt's budget is `sampling.max_tokens_each[i]` (else `max_tokens`); a completion that reaches it ends with
  finish reason "length".
- `sampling.extra["stop"]`: a completion ends at the first stop string in its decoded text, and keeps its tokens up to
  and including the token that completed the string (vLLM with `include_stop_str_in_output`); its text ends with the
  stop string. The end-of-sequence token ends it too, and is kept. Both give finish reason "stop".
Where it departs from vLLM: the weights run in fp32 whatever the folder holds; log-probs are zeros (graders read
text, not log-probs); no prefix cache (each turn of an episode recomputes its prefix); a batch is left-padded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from grpo_pipe.types import Completion, GeneratedBatch, RequestTelemetry, SamplingSettings, derive_seed


class HFEngine:
    """Greedy or sampled generation with `transformers`, shaped as our `RolloutEngine` (see the module docstring).

    Args:
        batch_size: Sequences per `generate` call.
        device: The torch device to generate on; None: a GPU when there is one, else the CPU.
    """

    def __init__(self, batch_size: int = 64, device: str | None = None) -> None:
        self.batch_size = batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.served_version = 0  # graders load one snapshot per engine; nothing syncs into it
        self._model: Any = None
        self._tokenizer: Any = None
        self._model_path: Path | None = None

    # -- what a RolloutEngine reports ------------------------------------------------------------

    @property
    def model_path(self) -> Path | None:
        return self._model_path

    @property
    def weight_dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def in_process(self) -> bool:
        return True

    @property
    def max_model_len(self) -> int:
        return int(self._loaded().config.max_position_embeddings)

    @property
    def enable_sleep_mode(self) -> bool:
        return False

    # -- life cycle -------------------------------------------------------------------------------

    def connect(self, model_path: Path, options: dict[str, Any] | None = None) -> None:
        """Load the folder's model in fp32 and its tokenizer (which decodes text and finds stop strings)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self._model = model.to(self.device).eval()
        self._model_path = Path(model_path)

    def sleep(self, level: int) -> None:
        """Nothing to free between calls: a grader's engine lives for one snapshot."""

    def wake_up(self) -> None:
        """See `sleep`."""

    def shutdown(self) -> None:
        self._model = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- generation -------------------------------------------------------------------------------

    def submit(self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings) -> GeneratedBatch:
        started = time.time()
        return GeneratedBatch(self.generate(prompts, samples, sampling), started, time.time())

    def generate(
        self, prompts: Sequence[Sequence[int]], samples: Sequence[int], sampling: SamplingSettings
    ) -> list[list[Completion]]:
        """For prompt i, `samples[i]` completions (see the module docstring for budgets, stops and seeds)."""
        rows = [(index, tuple(prompt)) for index, prompt in enumerate(prompts) for _ in range(samples[index])]
        done: list[Completion] = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            seed = None if sampling.seed is None else derive_seed(sampling.seed, start)
            budgets = [sampling.max_tokens_of(index) for index, _ in chunk]
            done += self._generate_batch([prompt for _, prompt in chunk], budgets, sampling, seed)
        grouped: list[list[Completion]] = [[] for _ in prompts]
        for (index, _), completion in zip(rows, done):
            grouped[index].append(completion)
        return grouped

    def _generate_batch(self, prompts: list[tuple[int, ...]], budgets: list[int], sampling: SamplingSettings,
                        seed: int | None) -> list[Completion]:
        model, tokenizer = self._loaded(), self._tokenizer
        stops = [str(s) for s in sampling.extra.get("stop", ())]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=self.device)  # [B, W]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)  # [B, W]
        if max(budgets) > 0:
            config = _generation_config(sampling, max(budgets), self._eos_ids(), pad)
            ends = StoppingCriteriaList([_TurnEnds(width, budgets, stops, tokenizer)])
            devices = [self.device.index or 0] if self.device.type == "cuda" else []
            with torch.no_grad(), torch.random.fork_rng(devices=devices):  # a seed here leaves the caller's RNG alone
                if seed is not None:
                    torch.manual_seed(seed)
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                     stopping_criteria=ends)  # [B, W + new]
            generated = out[:, width:].tolist()
        else:
            generated = [[] for _ in prompts]
        return [self._completion(prompt, tokens, budget, stops)
                for prompt, tokens, budget in zip(prompts, generated, budgets)]

    def _completion(self, prompt: tuple[int, ...], tokens: list[int], budget: int, stops: list[str]) -> Completion:
        kept, finish, text = cut_completion(tokens, budget, stops, self._eos_ids(), self._decode)
        telemetry = RequestTelemetry(prompt_tokens=len(prompt), generated_tokens=len(kept), cached_prompt_tokens=0)
        return Completion(token_ids=tuple(kept), logprobs=(0.0,) * len(kept), text=text, finish_reason=finish,
                          policy_version=self.served_version, telemetry=telemetry)

    def _decode(self, tokens: Sequence[int]) -> str:
        return self._tokenizer.decode(list(tokens), skip_special_tokens=True)

    def _eos_ids(self) -> set[int]:
        configured = self._loaded().generation_config.eos_token_id
        ids = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
        return ids | ({self._tokenizer.eos_token_id} if self._tokenizer.eos_token_id is not None else set())

    def _loaded(self) -> Any:
        if self._model is None:
            raise RuntimeError("HFEngine used before connect() or after shutdown()")
        return self._model


def cut_completion(tokens: Sequence[int], budget: int, stops: Sequence[str], eos_ids: set[int],
                   decode: Callable[[Sequence[int]], str]) -> tuple[list[int], str, str]:
    """The tokens a completion keeps, its finish reason and its text: up to the budget, the end-of-sequence token or
    the token that completes a stop string, whichever comes first (what `generate` wrote after that is padding)."""
    kept: list[int] = []
    for token in tokens[:budget]:
        kept.append(token)
        if token in eos_ids:
            return kept, "stop", decode(kept)
        if stops:
            text = decode(kept)
            found = [at + len(stop) for stop in stops if (at := text.find(stop)) >= 0]
            if found:
                return kept, "stop", text[: min(found)]
    return kept, "length", decode(kept)


class _TurnEnds(StoppingCriteria):
    """Ends each row at its own budget or at its first stop string (generate itself ends rows at end-of-sequence)."""

    def __init__(self, prompt_width: int, budgets: list[int], stops: list[str], tokenizer: Any) -> None:
        self.prompt_width = prompt_width
        self.budgets = budgets  # [B]
        self.stops = stops
        self.tokenizer = tokenizer

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids[:, self.prompt_width :].tolist()  # [B, new so far]
        ended = [len(tokens) >= budget or self._stopped(tokens) for tokens, budget in zip(generated, self.budgets)]
        return torch.tensor(ended, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]

    def _stopped(self, tokens: list[int]) -> bool:
        if not self.stops:
            return False
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return any(stop in text for stop in self.stops)


def _generation_config(sampling: SamplingSettings, max_new_tokens: int, eos_ids: set[int], pad: int) -> GenerationConfig:
    """Greedy at temperature 0, else plain sampling at the temperature with top-p and no top-k (vLLM's defaults)."""
    common = {"max_new_tokens": max_new_tokens, "eos_token_id": sorted(eos_ids), "pad_token_id": pad}
    if sampling.temperature <= 0.0:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0, **common)
