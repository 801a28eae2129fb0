"""The GRPO optimisation step: advantages, micro-batched loss, `updates_per_batch` optimizer updates.

The loss (`loss=grpo|dr_grpo|dapo`), the optimizer (`optimizer=adamw`) and the LR schedule are
components built from the config and handed in (the last two inside `trainer.optimisation`); this
module only runs them. Completions whose advantage is exactly zero (groups where every sample got the
same reward) add nothing to the policy gradient, so with the KL term off they are counted in the
normaliser but never run through the model: on CPU this often halves the step time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import ChecksItsConfig, PolicyLoss
from grpo_pipe.trainer import token_budget
from grpo_pipe.trainer.batch import TrainSample, collate
from grpo_pipe.trainer.batch_plan import (
    BatchPlan,
    PassCache,
    default_max_tokens,
    default_micro_batch_size,
    loss_metrics,
    make_plan,
)
from grpo_pipe.trainer.compiled import COMPILED_WIDTH_MULTIPLE, compile_layers, compile_on, warm_up
from grpo_pipe.trainer.diagnosis import non_finite_gradients, second_pass
from grpo_pipe.trainer.lm_head import causal_lm_parts
from grpo_pipe.trainer.loss import GRPOLoss
from grpo_pipe.trainer.mismatch import MismatchSums, mismatch_sums
from grpo_pipe.trainer.packed_attention import packing_problem, use_packed_attention
from grpo_pipe.trainer.packing import pack, sequence_tokens
from grpo_pipe.trainer.precision import Precision
from grpo_pipe.trainer.rng import restore_rng, rng_state
from grpo_pipe.trainer.scoring import Scorer, is_sharded, takes_logits_to_keep
from grpo_pipe.trainer.settings import BatchingSettings, OptimisationSettings, PrecisionSettings
from grpo_pipe.trainer.throughput import ModelShape, peak_flops, throughput_metrics
from grpo_pipe.types import RolloutGroup

log = logging.getLogger(__name__)


class TrainablePolicy(Protocol):
    """What the trainer needs of the `policy` group: a module to train, its trainable weights, a frozen reference."""

    module: torch.nn.Module | None

    def load(self, model_path: Path, device: torch.device, dtype: torch.dtype) -> None:
        """Load the model (and wrap it: a LoRA adapter, FSDP shards) onto the device.

        Args:
            model_path: The model's Hugging Face folder.
            device: Where the trainer runs.
            dtype: The master weights' dtype.
        """
        ...

    def trainable_parameters(self) -> list[torch.nn.Parameter]: ...

    def keep_reference(self) -> None:
        """Keep what `reference_logits` needs (the frozen starting weights); called once after load."""

    def reference_logits(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        """The frozen starting policy's logits for these forward arguments, without gradients.

        Args:
            inputs: The model's forward arguments (input ids, positions or attention mask, `logits_to_keep`).
        """
        ...


class GRPOTrainer:
    """Owns the policy, its optimizer and LR schedule; one `step` = `updates_per_batch` optimizer updates
    on one batch of rollouts (GRPO's mu), which bumps the policy version once.

    Besides the policy, the loss and the run's length, its settings come in three groups (trainer/settings.py): how
    the weights move (`optimisation`), how a batch is cut into passes (`batching`), the numbers it trains in
    (`precision`).

    Args:
        policy: What is trained (`policy=`): every weight, or a LoRA adapter.
        loss: The policy-gradient loss (`loss=`); None = `GRPOLoss` with its defaults.
        steps: Optimizer steps (batches) the run trains for.
        optimisation: How one batch moves the weights: optimizer, LR schedule, `lr`, clipping, `updates_per_batch`.
        batching: How a batch is cut into forward/backward passes: packed or padded, their sizes.
        precision: The weights' dtype, the autocast dtype, whether decoder layers are compiled.
    """

    def __init__(
        self,
        *,
        policy: TrainablePolicy,
        loss: PolicyLoss | None = None,
        steps: int = 40,
        optimisation: OptimisationSettings = OptimisationSettings(),
        batching: BatchingSettings = BatchingSettings(),
        precision: PrecisionSettings = PrecisionSettings(),
    ) -> None:
        self.policy = policy
        self.loss: PolicyLoss = loss or GRPOLoss()
        self.steps = steps
        self.optimisation = optimisation
        self.batching = batching
        self.precision = precision
        self.micro_batch_size = batching.micro_batch_size or default_micro_batch_size()  # resolved for this machine
        self.max_tokens = batching.max_tokens or default_max_tokens()
        self.packed = batching.packed  # may be turned off in setup for a model whose attention cannot pack
        self.scorer: Scorer | None = None  # runs the model on a micro-batch, padded or packed (built in setup)
        self.shape: ModelShape | None = None  # for the FLOP count (train/mfu); None: the config lacks the numbers
        self.peak: float | None = None  # the device's dense bf16 peak, FLOP/s; None: not known
        self.dtypes = Precision(torch.float32, None)  # resolved for the device in setup
        self.version = 0  # bumped by every step that applied at least one optimizer update
        self.bad_steps_in_a_row = 0
        self.skipped_updates = 0  # non-finite updates skipped over the whole run
        self.device = torch.device("cpu")
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.pad_id = 0
        self.width_multiple = 1  # micro-batch widths are padded to a multiple of this (8 for compiled layers)

    def config_problems(self) -> list[str]:
        """This trainer's rules, its settings groups', and the loss's it was given."""
        own = failed((self.steps >= 1, f"trainer.steps={self.steps}: must be >= 1"))
        groups = self.optimisation.config_problems() + self.batching.config_problems() + self.precision.config_problems()
        loss = self.loss.config_problems() if isinstance(self.loss, ChecksItsConfig) else []
        return own + groups + loss

    def setup(self, model_path: Path, device: torch.device, pad_id: int) -> None:
        if device.type == "cuda" and device.index is not None:
            # The trainer's card becomes this process's current device, as each rank of the sharded trainer does.
            # placement=split gives the trainer a card no replica took, often not the first; left on the first (an
            # engine's), whatever reads the current device instead of its tensors' reads the engine's card (the
            # memory figures did) or launches there, unordered with the trainer's own work.
            torch.cuda.set_device(device)
        self.device = device
        self.pad_id = pad_id
        self.dtypes = Precision.resolve(self.precision.dtype, self.precision.autocast, device)
        self.policy.load(model_path, device, self.dtypes.weights)
        module = self.policy.module
        assert module is not None, "the policy loaded no model"
        parts = self._set_up_packing(module)
        self._set_up_throughput()
        compiled = compile_on(self.precision.compile, device)
        if compiled:
            compile_layers(module, packed=self.packed)
        self.scorer = Scorer(module=module, reference_logits=self.policy.reference_logits, device=device,
                             dtypes=self.dtypes, logits_to_keep=takes_logits_to_keep(module), parts=parts,
                             fused_head=compiled and self.packed)
        if compiled:
            warm_up(module, self.pad_id, device, self.dtypes.autocast, self.scorer.logits_to_keep,
                    score=self._warm_up_score if self.packed else None)
            self.width_multiple = COMPILED_WIDTH_MULTIPLE
        if self.loss.needs_reference:
            self.policy.keep_reference()
        if self._sizes_passes_from_memory(module):  # after everything the trainer keeps on the card, before any update
            self.max_tokens = token_budget.measured_max_tokens(self._warm_up_score, module, self.pad_id, device,
                                                               self.policy.trainable_parameters())
        self.optimizer = self.optimisation.make_optimizer(self.policy.trainable_parameters())
        self.scheduler = self.optimisation.make_scheduler(self.optimizer, self.steps)

    def _warm_up_score(self, samples: list[TrainSample]) -> torch.Tensor:
        """A packed micro-batch's log-probs and entropy through the trainer's own path (compiles what training runs)."""
        assert self.scorer is not None
        batch = pack(samples, self.device, COMPILED_WIDTH_MULTIPLE)
        logprobs, entropy = self.scorer.policy_scores(batch, 1.0, entropy_grad=True, need_entropy=True)
        assert entropy is not None
        return logprobs + entropy

    def _sizes_passes_from_memory(self, module: torch.nn.Module) -> bool:
        """`trainer.batching.max_tokens: null` on a GPU, packed, one device: the budget is measured (token_budget.py).
        A sharded rank keeps the fixed default: every rank must cut a batch the same way."""
        return (self.batching.max_tokens is None and self.packed and self.device.type == "cuda"
                and not is_sharded(module))

    def _set_up_packing(self, module: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
        """Packed micro-batches need the model's attention switched to the packed kind and its head apart from its
        decoder; a model that cannot (sliding windows, logits that are more than the head's output) is trained on
        padded micro-batches, and the log says why. Returns the decoder and head to run apart (None: run whole)."""
        if not self.packed:
            return None
        parts = causal_lm_parts(module)
        why = packing_problem(getattr(module, "config", None)) if parts else "its logits are not its lm head's output"
        if why is not None or parts is None:
            log.warning("Padded micro-batches for this model: %s (trainer.batching.packed)", why)
            self.packed = False
            return None
        use_packed_attention(module)
        return None if is_sharded(module) else parts  # a sharded root's hooks gather the head's weights: it runs whole

    def _set_up_throughput(self) -> None:
        """The model's shape for the FLOP count and the device's peak, for `train/mfu`; either may be unknown."""
        try:
            self.shape = ModelShape.from_config(getattr(self.policy.module, "config", None))
        except (AttributeError, TypeError, ValueError):
            self.shape = None
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type
        self.peak = peak_flops(name)
        if self.peak is None:
            log.info("train/mfu is not reported: the dense bf16 peak of %r is not known (trainer/throughput.py)", name)

    def close(self) -> None:
        """Nothing outside this process to release."""

    def state_dict(self) -> dict[str, Any]:
        """Everything an exact resume needs: trainable weights, optimizer, LR schedule, counters, RNG."""
        if self.optimizer is None or self.policy.module is None:
            raise RuntimeError("trainer used before setup()")
        params = {n: p.detach().cpu().clone() for n, p in self.policy.module.named_parameters() if p.requires_grad}
        return {
            "params": params,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
            "bad_steps_in_a_row": self.bad_steps_in_a_row,
            "skipped_updates": self.skipped_updates,
            "rng": rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.optimizer is None or self.policy.module is None:
            raise RuntimeError("trainer used before setup()")
        named = dict(self.policy.module.named_parameters())
        missing = sorted(set(state["params"]) - set(named))
        if missing:
            raise ValueError(f"checkpoint has parameters this policy lacks (another policy config?): {missing[:5]}")
        with torch.no_grad():
            for name, tensor in state["params"].items():
                named[name].copy_(tensor.to(named[name].device, named[name].dtype))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
        self.bad_steps_in_a_row = int(state["bad_steps_in_a_row"])
        self.skipped_updates = int(state["skipped_updates"])
        restore_rng(state["rng"])

    def step(self, groups: Sequence[RolloutGroup], rewards: Sequence[float], temperature: float) -> dict[str, float]:
        """`updates_per_batch` optimizer updates on these groups; the version moves by one. Returns `train/...` metrics."""
        return self.train_plan(self.plan(groups, rewards), temperature)

    def train_plan(self, plan: BatchPlan, temperature: float, diagnose: bool = True) -> dict[str, float]:
        """`step` on a plan already made (the sharded trainer hands each rank its share of one batch's plan).
        `diagnose`: a non-finite gradient is looked into by a second pass (`_diagnose`) where
        `trainer.optimisation.diagnose_non_finite` allows it; a sharded trainer's ranks pass False (one rank
        stopping mid-pass would leave the others waiting in a collective)."""
        started = time.perf_counter()
        cache = PassCache()  # per micro-batch, from the first pass: the frozen reference, the proximal policy
        passes, applied_any, grad_norms = [], False, []
        explain = ((lambda: self._diagnose(plan, temperature, cache))
                   if diagnose and self.optimisation.diagnose_non_finite else None)
        for _ in range(self.optimisation.updates_per_batch):
            passes.append(self._accumulate(plan, temperature, cache))
            applied, grad_norm = self._apply_update(explain)
            applied_any |= applied
            grad_norms.append(grad_norm)
        if applied_any:
            self.version += 1
        seconds = time.perf_counter() - started
        return {
            **self._throughput(plan, seconds),
            **plan.metrics(),
            **passes[0],  # the loss and the mismatch as the batch found the policy
            "train/clip_fraction": sum(p["train/clip_fraction"] for p in passes) / len(passes),
            "train/grad_norm": grad_norms[0],
            "train/update_applied": float(applied_any),
            "train/skipped_updates_total": float(self.skipped_updates),
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/step_s": seconds,
        }

    def _throughput(self, plan: BatchPlan, seconds: float) -> dict[str, float]:
        """`train/tokens_per_s` (prompt and completion tokens through forward and backward, every pass) and
        `train/mfu` by the count in trainer/throughput.py."""
        passes = self.optimisation.updates_per_batch
        lengths = [sequence_tokens(s) for s in plan.active]
        flops = self.shape.step_flops(lengths, sum(s.trained_tokens for s in plan.active)) if self.shape else 0.0
        peak = self.peak if self.shape else None
        return throughput_metrics(tokens=passes * sum(lengths), flops=passes * flops, seconds=seconds, peak=peak)

    def plan(self, groups: Sequence[RolloutGroup], rewards: Sequence[float]) -> BatchPlan:
        """Advantages, which completions get a loss, which of those need a forward pass, the normaliser."""
        return make_plan(groups, rewards, self.loss, skip_zero_advantage=self.batching.skip_zero_advantage,
                         packed=self.packed, max_tokens=self.max_tokens, micro_batch_size=self.micro_batch_size)

    def _accumulate(self, plan: BatchPlan, temperature: float, cache: PassCache) -> dict[str, float]:
        """One pass over the plan's micro-batches. `cache` keeps, per micro-batch, what the first pass saw."""
        scorer = self.scorer
        assert scorer is not None and self.optimizer is not None, "trainer used before setup()"
        self.optimizer.zero_grad(set_to_none=True)
        first_pass = not cache.proximal
        # Nothing is read from the device until the pass ends: a read per micro-batch would make the host wait for
        # the card each time (trainer/device_values.py).
        loss_sum, stats, mismatches = torch.zeros((), device=self.device), [], []
        bonus = self.loss.needs_entropy  # the entropy is then a term of the loss, with its gradient
        for index, part in enumerate(plan.cuts):
            samples = plan.active[part.start : part.stop]
            batch = (pack(samples, self.device, self.width_multiple) if self.packed
                     else collate(samples, self.pad_id, self.device, self.width_multiple))
            if first_pass:
                cache.reference.append(scorer.reference_logprobs(batch, temperature) if self.loss.needs_reference
                                       else None)
            new_logprobs, entropy = scorer.policy_scores(batch, temperature, bonus, need_entropy=first_pass or bonus)
            inputs = batch.loss_inputs  # the same [B, T] tensors, padded or packed
            if first_pass:  # the policy as the batch found it: the proximal reference of every later pass
                cache.proximal.append(new_logprobs.detach())
                assert entropy is not None
                seen = entropy.detach()
                mismatches.append(mismatch_sums(new_logprobs, inputs.sampling_logprobs, inputs.completion_mask,
                                                self.loss.trust_region, seen))
            loss, step_stats = self.loss(
                new_logprobs, inputs.sampling_logprobs, inputs.advantages, inputs.completion_mask,
                plan.normaliser, ref_logprobs=cache.reference[index], proximal_logprobs=cache.proximal[index],
                entropy=entropy if bonus else None,
            )
            loss.backward()
            loss_sum += loss.detach()
            stats.append(step_stats)
        mismatch = MismatchSums.total(mismatches).metrics() if first_pass else {}
        return {"train/loss": float(loss_sum), **loss_metrics(stats), **mismatch}

    def _diagnose(self, plan: BatchPlan, temperature: float, cache: PassCache) -> str:
        """Why the last pass's gradient was not finite, from a second pass (trainer/diagnosis.py)."""
        return second_pass(lambda: self._accumulate(plan, temperature, cache), self.policy.module)

    def _apply_update(self, explain: Callable[[], str] | None = None) -> tuple[bool, float]:
        """Clip and apply; a non-finite gradient skips the update instead of poisoning the weights.
        `explain`: says why, after the tensors are named (it may overwrite the gradients)."""
        assert self.optimizer is not None
        params = self.policy.trainable_parameters()
        has_grad = any(p.grad is not None for p in params)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.optimisation.grad_clip)) if has_grad else 0.0
        if not math.isfinite(grad_norm):
            self.bad_steps_in_a_row += 1
            self.skipped_updates += 1
            where = non_finite_gradients(self.policy.module)
            where += explain() if explain is not None else ""
            log.warning("Non-finite gradient (norm=%s)%s; update skipped (%d in a row)", grad_norm, where,
                        self.bad_steps_in_a_row)
            if self.bad_steps_in_a_row >= self.optimisation.max_bad_steps:
                raise FloatingPointError(
                    f"{self.bad_steps_in_a_row} non-finite updates in a row (trainer.optimisation.max_bad_steps); "
                    f"the last{where}")
            self.optimizer.zero_grad(set_to_none=True)
            self.optimizer.step()  # no gradients: changes nothing, keeps the scheduler's step order
            self.scheduler.step()
            return False, grad_norm
        self.bad_steps_in_a_row = 0
        self.optimizer.step()  # a no-op for parameters without gradients
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return True, grad_norm

