"""One rank of the sharded trainer: a Ray actor holding an FSDP2-sharded copy of the policy.

Each rank builds the single-device `GRPOTrainer` around its own policy; the policy is sharded with
`fully_shard` (each decoder layer, then the root) as it loads, so the trainer's optimizer and LR schedule
are created over the sharded (DTensor) parameters and its step (the loss component micro-batch by
micro-batch, `updates_per_batch` passes, gradient clipping over the global norm, non-finite skip,
scheduler) runs unchanged, through `GRPOTrainer.train_plan`. What differs from one device:

1. The driver (`sharded.py`) plans the WHOLE batch with the single-device trainer's `plan` (advantages,
   mask_truncated, zero-advantage skip, the loss normaliser) and deals its micro-batches out; each rank
   trains on its share with that whole-batch normaliser, exactly as one device would.
2. Every rank runs the same number of micro-batches, since each forward/backward is a collective: a
   rank short of one runs a padding sample with an empty completion, whose loss is exactly zero.
3. FSDP's gradient reduction is set to a plain sum (divide factor 1): the micro-batch losses are
   already normalised by the whole batch, so the ranks' gradients add up to the full-batch gradient.
4. Mixed precision is FSDP's: parameters and optimizer state stay in the loaded dtype (fp32 master
   weights when `trainer.precision.dtype=float32`), forward/backward compute in `compute_dtype`, gradients are
   reduced in fp32.
5. The KL reference (`loss.kl_coef > 0`) is kept before sharding: LoRA's is the sharded model with the
   adapter off; a full fine-tune's is a whole, unsharded frozen copy on every rank (memory: one model
   per rank, in the loaded dtype).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from grpo_pipe.trainer.batch import TrainSample
from grpo_pipe.trainer.batch_plan import BatchPlan, PassCache
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.memory import memory_metrics
from grpo_pipe.trainer.policy import hf_weights
from grpo_pipe.transport.collective import TRAINER_RANK, Bucket, Group, join_as_sender, pack

log = logging.getLogger(__name__)


class ShardOnLoad:
    """Wraps a policy so that loading it also shards it (before the trainer builds its optimizer).

    Args:
        policy: The policy to load and shard (a `TrainablePolicy`).
        compute_dtype: FSDP's parameter dtype for forward and backward; None: the weights' own.
        needs_reference: Keep a reference copy of the whole weights before sharding (the loss's KL needs it).
    """

    def __init__(self, policy: Any, compute_dtype: torch.dtype | None, needs_reference: bool) -> None:
        self.inner = policy
        self.compute_dtype = compute_dtype
        self.needs_reference = needs_reference
        self.module: torch.nn.Module | None = None  # the inner policy's module, once loaded and sharded

    def load(self, model_path: Path, device: torch.device, dtype: torch.dtype) -> None:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        self.inner.load(model_path, device, dtype)
        if self.needs_reference:  # from the whole weights: a sharded module cannot be copied
            self.inner.keep_reference()
        module = self.inner.module
        precision = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        layer_types = set(getattr(_base_model(module), "_no_split_modules", None) or ())
        for sub in module.modules():  # one FSDP unit per decoder layer: its all-gather overlaps the previous one's compute
            if type(sub).__name__ in layer_types:
                fully_shard(sub, mp_policy=precision)
        fully_shard(module, mp_policy=precision)
        for sub in module.modules():  # sum, not average: each rank's loss is already over the whole batch
            if isinstance(sub, FSDPModule):
                sub.set_gradient_divide_factor(1.0)
                sub.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
        self.module = module

    def keep_reference(self) -> None:
        """Kept in `load`, before sharding."""

    def reference_logits(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        return self.inner.reference_logits(inputs)  # LoRA's is a collective forward

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.inner.trainable_parameters()


class ShardWorker:
    """The actor's body. Every method except `address` is collective: the driver calls it on all ranks.

    Args:
        trainer: This rank's single-device trainer; its policy is wrapped to shard on load.
        rank: This rank's index in the process group.
        world_size: The number of ranks.
        compute_dtype: The name of FSDP's parameter dtype (`bfloat16`); None: the weights' own.
    """

    def __init__(self, *, trainer: GRPOTrainer, rank: int, world_size: int, compute_dtype: str | None) -> None:
        self.rank, self.world_size = rank, world_size
        self.compute_dtype = None if compute_dtype is None else getattr(torch, compute_dtype)
        trainer.policy = ShardOnLoad(trainer.policy, self.compute_dtype, trainer.loss.needs_reference)
        self.trainer = trainer
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        self._weight_group: tuple[Group, Any] | None = None  # rank 0's place in a weight bridge's group (+ its store)
        self._in_flight_limit = 1

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

    def train(self, plan: BatchPlan, temperature: float) -> dict[str, float]:
        """The single-device step on this rank's share of the batch; this rank's metrics (the driver combines them)."""
        metrics = self.trainer.train_plan(plan, temperature, diagnose=False)  # a rank alone would stall the rest
        return {**metrics, **memory_metrics(self.device), "version": float(self.trainer.version)}

    def accumulate(self, plan: BatchPlan, temperature: float) -> dict[str, float]:
        """Fill the (sharded) gradients with the whole batch's loss gradient (one pass, no update)."""
        return self.trainer._accumulate(plan, temperature, PassCache())

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

    def sees(self, path: str) -> bool:
        """Whether this rank's host sees `path` (a file the runner just wrote): a shared filesystem."""
        return os.path.exists(path)

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

    def weight_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """Names and whole shapes of the weights `broadcast_weights` sends (a shard's shape is the whole one)."""
        return [(name, tuple(tensor.shape)) for name, tensor in hf_weights(self._live()[0])]

    def open_weight_group(self, backend: str, host: str, port: int, timeout_s: float, world_size: int) -> None:
        """Rank 0 joins a weight bridge's group as its sender; the other ranks only help gather (no-op here)."""
        self.close_weight_group()
        if self.rank == 0:
            self._weight_group = join_as_sender(backend, host, port, timeout_s, world_size)
            self._in_flight_limit = 2 if backend == "nccl" else 1  # gloo's own threads: one bucket at a time, in order

    def broadcast_weights(self, wire_plan: list[dict[str, Any]]) -> dict[str, float]:
        """Every rank gathers each whole tensor from the shards (a collective); rank 0 casts and packs each bucket
        and broadcasts it from its GPU, so the weights never leave the cards for a host or another process.
        At most two buckets are in flight: the next is packed while the previous travels, in bounded memory."""
        started = time.perf_counter()
        gathering = 0.0
        group = self._weight_group[0] if self._weight_group is not None else None
        if self.rank == 0 and group is None:
            raise RuntimeError("broadcast_weights before open_weight_group")
        weights = dict(hf_weights(self._live()[0]))
        in_flight: deque[tuple[Any, torch.Tensor]] = deque()
        for bucket in (Bucket.from_wire(wire) for wire in wire_plan):
            began = time.perf_counter()
            whole = [_whole(weights[spec.name]) for spec in bucket.specs]
            gathering += time.perf_counter() - began
            if group is None:  # not rank 0: this rank only helped gather
                continue
            if len(in_flight) == self._in_flight_limit:
                in_flight.popleft()[0].wait()
            flat = pack(bucket, whole)
            in_flight.append((group.broadcast(flat, TRAINER_RANK), flat))
        for work, _ in in_flight:
            work.wait()
        return {"gather_s": gathering, "send_s": time.perf_counter() - started}

    def close_weight_group(self) -> None:
        self._weight_group = None  # the store's client and the group go with their last reference

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


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) weight gathered whole on every rank; a plain tensor as it is."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if gather is not None else tensor


def _base_model(module: Any) -> Any:
    """The transformers model under a peft wrapper (or the module itself)."""
    getter = getattr(module, "get_base_model", None)
    return getter() if callable(getter) else module


def deal(plan: BatchPlan, world_size: int, pad_id: int) -> list[BatchPlan]:
    """The whole batch's plan -> one per rank: the single-device micro-batches dealt round-robin, each rank
    padded to the same count with one-sample padding micro-batches (zero advantage: no gradient), so every
    rank runs as many forward/backward passes as the others and the gradients sum to the single device's."""
    chunks = [plan.active[cut.start : cut.stop] for cut in plan.cuts]
    slots = -(-len(chunks) // world_size)  # no work at all: no pass, no gradient, as on one device
    padding = TrainSample(prompt_ids=(pad_id,), completion_ids=(), sampling_logprobs=(), advantage=0.0, policy_version=0)
    shares = []
    for rank in range(world_size):
        dealt = chunks[rank::world_size]
        share = [chunk for chunk in dealt] + [[padding]] * (slots - len(dealt))
        starts = [sum(len(c) for c in share[:i]) for i in range(len(share) + 1)]
        shares.append(replace(plan, active=[s for chunk in share for s in chunk],
                              cuts=[range(a, b) for a, b in zip(starts, starts[1:])]))
    return shares
