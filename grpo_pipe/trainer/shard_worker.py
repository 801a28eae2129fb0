"""One rank of the sharded trainer: a Ray actor holding an FSDP2-sharded copy of the policy.

Each rank builds the single-device `GRPOTrainer` around its own policy; the policy is sharded with
`fully_shard` (each decoder layer, then the root) as it loads, so the trainer's AdamW and LR schedule
are created over the sharded (DTensor) parameters and its update step (gradient clipping over the
global norm, non-finite skip, scheduler) runs unchanged. What differs from one device:

1. The driver (`sharded.py`) computes advantages over the whole batch and deals out micro-batches;
   every rank runs the same number of micro-batches (an empty slot runs a zero-loss forward), since
   each forward/backward is a collective.
2. Each micro-batch loss is normalised by the WHOLE batch (all ranks), exactly as on one device, and
   multiplied by the world size: FSDP averages gradients over ranks, the loss wants their sum.
3. Mixed precision is FSDP's: parameters and optimizer state stay in the loaded dtype (fp32 master
   weights when `trainer.dtype=float32`), forward/backward compute in `compute_dtype`, gradients are
   reduced in fp32.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from grpo_pipe.trainer.batch import TrainSample, collate, completion_logprobs
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.loss import policy_loss

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepPlan:
    """What one rank trains on in one optimizer step (made by the driver)."""

    micro_batches: tuple[tuple[TrainSample, ...], ...]  # this rank's; empty tuples pad to the common count
    total: int  # sequences in the whole step, all ranks (the loss normaliser)
    max_tokens: int  # longest completion in the whole step (dr_grpo's normaliser)
    temperature: float


class ShardOnLoad:
    """Wraps a policy so that loading it also shards it (before the trainer builds its optimizer)."""

    def __init__(self, policy: Any, compute_dtype: torch.dtype | None) -> None:
        self.inner = policy
        self.compute_dtype = compute_dtype
        self.module: torch.nn.Module | None = None  # the inner policy's module, once loaded and sharded

    def load(self, model_path: Path, device: torch.device, dtype: torch.dtype) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.inner.load(model_path, device, dtype)
        module = self.inner.module
        precision = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        layer_types = set(getattr(_base_model(module), "_no_split_modules", None) or ())
        for sub in module.modules():  # one FSDP unit per decoder layer: its all-gather overlaps the previous one's compute
            if type(sub).__name__ in layer_types:
                fully_shard(sub, mp_policy=precision)
        fully_shard(module, mp_policy=precision)
        self.module = module

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.inner.trainable_parameters()


class ShardWorker:
    """The actor's body. Every method except `address` is collective: the driver calls it on all ranks."""

    def __init__(self, trainer: GRPOTrainer, rank: int, world_size: int, compute_dtype: str | None) -> None:
        self.rank, self.world_size = rank, world_size
        self.compute_dtype = None if compute_dtype is None else getattr(torch, compute_dtype)
        trainer.policy = ShardOnLoad(trainer.policy, self.compute_dtype)
        self.trainer = trainer
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")

    def address(self) -> tuple[str, int]:
        """This node's address and a free port, for the rendezvous (asked of rank 0 only)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            return host, int(probe.getsockname()[1])

    def join(self, host: str, port: int, backend: str, timeout_s: float) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def setup(self, model_path: str, pad_id: int) -> dict[str, Any]:
        torch.manual_seed(0)  # every rank starts alike (LoRA init): FSDP shards assume identical full weights
        self.trainer.setup(Path(model_path), self.device, pad_id)
        config = getattr(_base_model(self.trainer.policy.module), "config", None)
        return {"tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)), "pid": os.getpid()}

    def train(self, plan: StepPlan) -> dict[str, float]:
        """One optimizer update; returns this rank's sums (the driver adds them up)."""
        sums = self.accumulate(plan)
        trainer = self.trainer
        applied, grad_norm = trainer._apply_update()  # the single-device update, over sharded parameters
        return {**sums, "applied": float(applied), "grad_norm": grad_norm,
                "lr": float(trainer.scheduler.get_last_lr()[0]), "version": float(trainer.version)}

    def accumulate(self, plan: StepPlan) -> dict[str, float]:
        """Fill the (sharded) gradients with the whole step's loss gradient, micro-batch by micro-batch."""
        trainer, module = self.trainer, self.trainer.policy.module
        assert trainer.optimizer is not None and module is not None
        trainer.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0, "ratio_max": 0.0}
        for chunk in plan.micro_batches:
            if not chunk:
                _idle_pass(module, self.device)
                continue
            batch = collate(chunk, trainer.pad_id, self.device)
            logits = module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [B, L, V]
            new_logprobs = completion_logprobs(logits, batch, plan.temperature)  # [B, T]
            loss, stats = policy_loss(
                new_logprobs, batch.sampling_logprobs, batch.advantages, batch.completion_mask,
                aggregation=trainer.aggregation, clip_low=trainer.clip_low, clip_high=trainer.clip_high,
                total_sequences=plan.total, max_tokens=plan.max_tokens, is_cap=trainer.is_cap,
            )
            (loss * self.world_size).backward()  # FSDP divides the reduced gradient by world_size
            sums["loss"] += float(loss.detach())
            sums["clipped"] += stats.clipped_tokens
            sums["tokens"] += stats.tokens
            sums["ratio_max"] = max(sums["ratio_max"], stats.ratio_max)
        return sums

    def full_state(self, what: str) -> dict[str, torch.Tensor]:
        """Unsharded `what` ('weights' or 'grads') under module names, on rank 0 only (CPU); {} elsewhere."""
        module = self.trainer.policy.module
        assert module is not None
        if what == "weights":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return dict(get_model_state_dict(module, options=options))  # type: ignore[arg-type]
        full = {}
        for name, param in module.named_parameters():
            if param.grad is not None:
                gather = getattr(param.grad, "full_tensor", None)  # a DTensor shard -> the whole gradient
                grad = gather() if gather is not None else param.grad
                full[name] = grad.detach().cpu()
        return full if self.rank == 0 else {}

    def adapter(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
        """LoRA policies: peft's adapter config and its unsharded tensors (rank 0; None elsewhere)."""
        from peft import get_peft_model_state_dict

        module: Any = self.trainer.policy.module
        full = self.full_state("weights")
        if self.rank != 0 or module is None:
            return None
        tensors = get_peft_model_state_dict(module, state_dict=full)
        config = module.peft_config["default"].to_dict()
        return config, {k: v.contiguous() for k, v in tensors.items()}

    def counters(self) -> dict[str, Any]:
        trainer = self.trainer
        return {
            "scheduler": trainer.scheduler.state_dict(),
            "version": trainer.version,
            "bad_steps_in_a_row": trainer.bad_steps_in_a_row,
            "skipped_updates": trainer.skipped_updates,
        }

    def set_counters(self, counters: dict[str, Any]) -> None:
        trainer = self.trainer
        trainer.scheduler.load_state_dict(counters["scheduler"])
        trainer.version = int(counters["version"])
        trainer.bad_steps_in_a_row = int(counters["bad_steps_in_a_row"])
        trainer.skipped_updates = int(counters["skipped_updates"])

    def save_sharded(self, folder: str) -> None:
        """Each rank writes its own shards of weights and optimizer state (torch.distributed.checkpoint)."""
        from torch.distributed.checkpoint.state_dict_saver import save

        save(self._dcp_state(), checkpoint_id=folder)

    def load_sharded(self, folder: str) -> None:
        """Reads a checkpoint written at any world size, resharded to this one."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
        from torch.distributed.checkpoint.state_dict_loader import load

        state = self._dcp_state()
        load(state, checkpoint_id=folder)
        module, optimizer = self._live()
        set_model_state_dict(module, state["model"])
        set_optimizer_state_dict(module, optimizer, state["optim"])

    def load_full(self, state: dict[str, Any]) -> None:
        """Weights and optimizer state gathered at any world size (`gathered_state` on the driver)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        module, optimizer = self._live()
        set_model_state_dict(module, state["model"], options=options)
        set_optimizer_state_dict(module, optimizer, state["optim"], options=options)
        self.set_counters(state["counters"])

    def gathered_state(self) -> dict[str, Any]:
        """Unsharded weights, optimizer state and counters, on rank 0 ({} elsewhere)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model, optim = get_state_dict(*self._live(), options=options)
        return {"model": model, "optim": optim, "counters": self.counters()} if self.rank == 0 else {}

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(*self._live())
        return {"model": model, "optim": optim}

    def _live(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        module, optimizer = self.trainer.policy.module, self.trainer.optimizer
        if module is None or optimizer is None:
            raise RuntimeError("rank used before setup()")
        return module, optimizer


def _idle_pass(module: torch.nn.Module, device: torch.device) -> None:
    """A zero-loss forward/backward: this rank joins the collectives of a micro-batch it has no data for."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)  # [1, 1]
    logits = module(input_ids=ids).logits  # [1, 1, V]
    (logits.float().sum() * 0.0).backward()


def _base_model(module: Any) -> Any:
    """The transformers model under a peft wrapper (or the module itself)."""
    getter = getattr(module, "get_base_model", None)
    return getter() if callable(getter) else module


def deal(samples: Sequence[TrainSample], micro_batch_size: int, world_size: int) -> list[list[tuple[TrainSample, ...]]]:
    """Cut samples (sorted by length, as on one device) into the single-device trainer's micro-batches,
    dealt round-robin over ranks; every rank gets the same number of slots (empty ones pad)."""
    ordered = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
    chunks = [tuple(ordered[i : i + micro_batch_size]) for i in range(0, len(ordered), micro_batch_size)]
    slots = -(-len(chunks) // world_size)  # no work at all: no pass, no gradient, as on one device
    per_rank: list[list[tuple[TrainSample, ...]]] = [[] for _ in range(world_size)]
    for index, chunk in enumerate(chunks):
        per_rank[index % world_size].append(chunk)
    for mine in per_rank:
        mine.extend([()] * (slots - len(mine)))
    return per_rank
