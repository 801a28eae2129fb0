"""The learning side: the loss, the trainer, and where it runs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from grpo_pipe.interfaces.engines import RolloutEngine
from grpo_pipe.interfaces.weights import Policy
from grpo_pipe.types import (
    LossStats,
    RolloutGroup,
)


@runtime_checkable
class PolicyLoss(Protocol):
    """The policy-gradient loss (`loss=`): advantages from rewards, and the per-micro-batch loss. The trainer knows
    nothing of the algorithm beyond this; `grpo_pipe.trainer.loss.PolicyGradientLoss` is the GRPO family."""

    @property
    def needs_reference(self) -> bool:
        """Whether `__call__` needs the frozen starting policy's log-probs (a KL term)."""
        ...

    @property
    def needs_every_sample(self) -> bool:
        """Whether zero-advantage completions must still run (a term with a gradient for them, or a normaliser
        that counts their tokens per micro-batch)."""
        ...

    @property
    def needs_entropy(self) -> bool:
        """Whether `__call__` takes the policy's entropy per token, with its graph (an entropy bonus)."""
        ...

    @property
    def masks_truncated(self) -> bool:
        """Whether completions that hit the budget without EOS get no loss and are in no normaliser."""
        ...

    @property
    def trust_region(self) -> tuple[float, float] | None:
        """(low, high): the ratio band [1 - low, 1 + high] the loss keeps, read by the mismatch metrics
        (`mismatch/outside_clip_fraction`); None for a loss that clips no ratio."""
        ...

    def advantages(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """One advantage per completion.

        Args:
            rewards: [N] one reward per completion.
            group_ids: [N] equal ids share a prompt.
        """
        ...

    def normaliser(self, lengths: Sequence[int], micro_batches: int = 1) -> float:
        """What the whole batch's summed loss is divided by.

        Args:
            lengths: The lengths of the completions that get a loss.
            micro_batches: How many micro-batches the step has.
        """
        ...

    def __call__(
        self,
        new_logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        normaliser: float,
        ref_logprobs: torch.Tensor | None = None,
        proximal_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LossStats]:
        """One micro-batch's loss, pre-divided by the batch's normaliser, and its detached statistics.

        Args:
            new_logprobs: [B, T] the policy's log-probs of the completion tokens, with their graph.
            old_logprobs: [B, T] the engine's log-probs of the same tokens, as it sampled them.
            advantages: [B] one per completion.
            mask: [B, T] 1 on tokens that get a loss.
            normaliser: From `normaliser` over the whole step.
            ref_logprobs: [B, T] under the frozen starting policy, when `needs_reference`.
            proximal_logprobs: [B, T] the trainer's, as the batch found the policy (None: `new_logprobs` detached).
            entropy: [B, T] the policy's entropy per position, with its graph, when `needs_entropy`.
        """
        ...


@runtime_checkable
class SamplingCorrection(Protocol):
    """The correction for the engine's sampling mismatch (`loss/correction=`): a detached weight per token from the
    trainer's and the engine's log-probs of the sampled tokens (trainer/importance.py)."""

    def weights(self, trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight [B, T] each token's loss is multiplied by, and [B, T] bool: the tokens it truncated or masked.

        Args:
            trainer_logprobs: [B, T] the trainer's log-probs, as the batch found the policy, detached.
            sampler_logprobs: [B, T] the engine's.
            mask: [B, T] 1 on tokens that get a loss.
        """
        ...


@runtime_checkable
class Trainer(Protocol):
    """Owns the policy and its optimizer; one `step` trains on one batch of groups: `updates_per_batch` optimizer
    updates (one by default), the policy version moving by one (advantages included).

    Attributes:
        steps: Optimizer steps the run is configured for.
        version: Bumped by every applied update: the policy version the engine should serve.
    """

    steps: int  # optimizer steps the run is configured for
    version: int  # bumped by every applied update: the policy version the engine should serve

    @property
    def policy(self) -> Policy: ...

    def setup(self, model_path: Path, device: torch.device, pad_id: int) -> None:
        """Load the policy on `device` and build the optimizer.

        Args:
            model_path: The materialized model folder the policy starts from.
            device: Where the placement puts the trainer (`Placement.trainer_device`).
            pad_id: The tokenizer's padding token id, for padded rows.
        """
        ...

    def step(self, groups: Sequence[RolloutGroup], rewards: Sequence[float], temperature: float) -> dict[str, float]:
        """Group advantages from `rewards` ([N], group order), one update; returns metrics to log.

        Args:
            groups: The batch's groups: each task with its completions' token ids and the engine's log-probs.
            rewards: One reward per completion, in group order then completion order.
            temperature: The sampling temperature the completions were drawn at: the policy's logits are divided by
                it, so its log-probs are those of the distribution the engine sampled.
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: trainable weights, optimizer, LR schedule, counters, RNG."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict`'s output.

        Args:
            state: What `state_dict` returned when the checkpoint was written.
        """
        ...

    def close(self) -> None:
        """Release what `setup` started beyond this process (a sharded trainer's rank actors)."""
        ...


@runtime_checkable
class ShardedState(Protocol):
    """A trainer whose processes write their own shards of the training state (a sharded trainer's ranks): a
    checkpoint then never gathers the whole state into one process, and reads back at any world size."""

    def shares_folder(self, folder: Path) -> bool:
        """Whether every process that would write a shard sees `folder` (on a cluster: a shared filesystem).

        Args:
            folder: The checkpoint folder the shards would go to.
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """The whole state gathered into this process: for a folder the ranks do not all see."""
        ...

    def save_sharded(self, folder: Path) -> None:
        """Write the whole training state into `folder` (on several machines: a filesystem every rank sees).

        Args:
            folder: The checkpoint folder; each rank writes its own shard files into it.
        """
        ...

    def load_sharded(self, folder: Path) -> None:
        """Read what `save_sharded` wrote, at this or any other world size.

        Args:
            folder: A checkpoint folder `save_sharded` wrote.
        """
        ...


@runtime_checkable
class Placement(Protocol):
    """Where the engine and the trainer live and how they hand the device to each other.

    Attributes:
        sleep_level: vLLM sleep level while the trainer runs; 0 = the engine keeps its memory.
    """

    sleep_level: int  # vLLM sleep level while the trainer runs; 0 = the engine keeps its memory

    def place(self, engine: RolloutEngine) -> RolloutEngine:
        """The engine the runner should use: `engine` itself, or a handle to copies of it placed elsewhere.

        Args:
            engine: The configured engine, not started.
        """
        ...

    def trainer_device(self) -> torch.device:
        """Valid once the engine is connected (where engines went decides what is left)."""
        ...

    def before_rollout(self, engine: RolloutEngine) -> None:
        """Hand the device to the engine (colocated: wake it up).

        Args:
            engine: The engine `place` returned.
        """
        ...

    def before_train(self, engine: RolloutEngine) -> None:
        """Hand the device to the trainer (colocated: put the engine to sleep at `sleep_level`).

        Args:
            engine: The engine `place` returned.
        """
        ...

    def before_sync(self, engine: RolloutEngine) -> None:
        """Make the engine ready to receive weights.

        Args:
            engine: The engine `place` returned.
        """
        ...

    def restart_engines(self, engine: RolloutEngine, attempt: int) -> None:
        """Replace engines that died (after a back-off), or raise when that is not possible or too often.

        Args:
            engine: The engine `place` returned.
            attempt: How many restarts this is (1 for the first): the back-off and the limit are counted on it.
        """
        ...

    def check(self, trainer: Trainer) -> list[str]:
        """What this machine or cluster cannot give the configured trainer and engines (GPUs, a reachable
        Ray cluster, a trainer kind this placement cannot host); checked before anything loads.

        Args:
            trainer: The configured trainer, not set up (its kind and world size are read).
        """
        ...

    def close(self) -> None:
        """Release what `place` started (processes, actors)."""
        ...
