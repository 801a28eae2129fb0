"""The sharded trainer (`trainer=fsdp`): the GRPO update on `world_size` devices with torch FSDP2.

The ranks are Ray actors (`shard_worker.ShardWorker`) in one Ray placement group, so Ray knows every
device the trainer holds, on one machine or across a cluster. This object lives in the runner's
process and looks to it like the single-device `GRPOTrainer`: `setup`, `step`, `version`, a `policy`
the weight bridges read. It plans the whole batch with the single-device trainer's own `plan`
(advantages over whole groups, mask_truncated, the loss component's normaliser over the whole batch)
and deals the micro-batches out; each rank runs the single-device step on its share, so the loss
component (grpo, dr_grpo, dapo, KL to the frozen reference), `updates_per_batch`, the optimizer and the
LR schedule are the configured ones, micro-batch for micro-batch. Weights leave the ranks through Ray (unsharded
on rank 0, then to this process), so no file path is shared between machines.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
import typing
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from grpo_pipe.config.dependencies import ray_problems
from grpo_pipe.config.errors import failed
from grpo_pipe.runtime.undertaker import Undertaker, fate_shared
from grpo_pipe.trainer.batch_plan import BatchPlan
from grpo_pipe.trainer.errors import TrainerLost
from grpo_pipe.trainer.grpo import GRPOTrainer
from grpo_pipe.trainer.settings import PrecisionSettings
from grpo_pipe.trainer.shard_worker import ShardWorker, deal
from grpo_pipe.trainer.sharded_policy import ShardedPolicy
from grpo_pipe.types import RolloutGroup

log = logging.getLogger(__name__)

ComputeDtype = Literal["auto", "bfloat16", "float16", "float32"]


class ShardedTrainer:
    """`world_size` FSDP2 ranks behind the single-device trainer's surface.

    Every setting other than the ones below is a `GRPOTrainer` setting, passed to each rank as is.

    Each rank is a Ray actor in one Ray placement group; pair with `placement=split` and `weight_bridge=nccl`, `lora`
    or `checkpoint`.

    Args:
        policy: What is trained (`policy=`), built on every rank.
        world_size: Ranks (GPUs on a GPU cluster, processes on CPU).
        compute_dtype: The forward/backward dtype (FSDP mixed precision); `auto` = bf16 on GPUs, none on CPU. Weights
            and AdamW state stay in `trainer.precision.dtype`.
        cpus_per_rank: Ray CPUs per rank.
        gpus_per_rank: Ray GPUs per rank (ignored where the cluster has none).
        backend: `auto` = nccl on GPUs, gloo on CPUs.
        timeout_s: Rendezvous, collectives and Ray's reservation: a missing rank is an error, not a hang.
        **settings: Every `GRPOTrainer` setting (`loss`, `steps`, `optimisation`, `batching`, `precision`), passed
            to each rank as is (layers are never compiled); an unknown one is a config problem.
    """

    def __init__(
        self,
        *,
        policy: Any,
        world_size: int = 2,
        compute_dtype: ComputeDtype | None = "auto",
        cpus_per_rank: int = 1,
        gpus_per_rank: int = 1,
        backend: Literal["auto", "gloo", "nccl"] = "auto",
        timeout_s: float = 300.0,
        **settings: Any,
    ) -> None:
        # The ranks never compile (not supported for sharded layers yet); an explicit true is a config problem.
        precision: PrecisionSettings = settings.get("precision", PrecisionSettings())
        self._asked_to_compile = precision.compile is True
        settings["precision"] = dataclasses.replace(precision, compile=False)
        self._allowed = [n for n in inspect.signature(GRPOTrainer).parameters if n != "policy"]
        self._unknown = sorted(set(settings) - set(self._allowed))  # reported by `config_problems`, not passed on
        known = {key: value for key, value in settings.items() if key in self._allowed}
        self.template = GRPOTrainer(policy=policy, **known)  # its rules are every single-device setting's
        self.world_size = world_size
        self.compute_dtype = compute_dtype
        self.cpus_per_rank = cpus_per_rank
        self.gpus_per_rank = gpus_per_rank
        self.backend = backend
        self.timeout_s = timeout_s
        self.lost = False  # a rank died: the trainer cannot go on (see `_all_ranks`)
        self.policy = ShardedPolicy(self, policy)
        self.version = 0
        self.workers: list[Any] = []
        self.model_path: Path | None = None
        self._group: Any = None
        self._tied = False
        self.pad_id = 0
        self._undertaker: Undertaker | None = None  # watches the local Ray node `setup` may start

    # The runner reads these as it would the single-device trainer's.
    def config_problems(self) -> list[str]:
        """The sharded settings' rules, the single-device trainer's, and Ray's presence (each rank is a Ray actor)."""
        unknown = [
            f"trainer.{key}: unknown setting for ShardedTrainer; allowed: world_size, compute_dtype, cpus_per_rank, "
            f"gpus_per_rank, backend, timeout_s, {', '.join(self._allowed)}"
            for key in self._unknown
        ]
        own = failed(
            (self.world_size >= 1, f"trainer.world_size={self.world_size}: must be >= 1"),
            (self.cpus_per_rank >= 1, f"trainer.cpus_per_rank={self.cpus_per_rank}: must be >= 1"),
            (self.gpus_per_rank >= 0, f"trainer.gpus_per_rank={self.gpus_per_rank}: must be >= 0"),
            (not self._asked_to_compile, "trainer.precision.compile=true: not with trainer=fsdp (compiling sharded "
                                         "layers is not supported here yet); allowed: false, auto (= false for the "
                                         "sharded trainer)"),
        )
        return unknown + own + self.template.config_problems() + ray_problems("_target_: trainer=fsdp")

    @property
    def steps(self) -> int:
        return self.template.steps

    @property
    def tie_word_embeddings(self) -> bool:
        return self._tied

    def gpus_needed(self, cuda: bool) -> int:
        return self.world_size * self.gpus_per_rank if cuda else 0

    def setup(self, model_path: Path, device: torch.device, pad_id: int) -> None:
        """Start the ranks (`device` is ignored: Ray gives each rank its own) and load the sharded policy."""
        import ray

        started = time.perf_counter()
        self.model_path = Path(model_path)
        self.pad_id = pad_id
        if not ray.is_initialized():  # placement=split starts Ray (or joins a cluster) first; else a local one
            # The undertaker stops the node's processes if this one is killed (Ray's agents would outlive it a minute);
            # the node lives as long as this process, so the undertaker, which then ends by itself, does too.
            _, self._undertaker = fate_shared(lambda: ray.init(
                address="local", num_cpus=max(self.world_size * self.cpus_per_rank + 1, 2), include_dashboard=False,
                _node_ip_address="127.0.0.1", log_to_driver=True))
        self.workers = self._start_workers()
        host, port = ray.get(self.workers[0].address.remote())
        backend = self._resolved_backend()
        ray.get([w.join.remote(host, port, backend, self.timeout_s) for w in self.workers])
        infos = ray.get([w.setup.remote(str(model_path), pad_id) for w in self.workers])
        self._tied = bool(infos[0]["tie_word_embeddings"])
        log.info("Sharded trainer: %d rank(s) over %s up in %.1fs", self.world_size, backend, time.perf_counter() - started)

    def step(self, groups: Sequence[RolloutGroup], rewards: Sequence[float], temperature: float) -> dict[str, float]:
        """`updates_per_batch` optimizer updates on these groups, across every rank. Returns `train/...` metrics."""

        started = time.perf_counter()
        whole, shares = self.plan(groups, rewards)
        results = self._all_ranks([w.train.remote(share, temperature) for w, share in zip(self.workers, shares)])
        self.version = int(results[0]["version"])
        return {**whole.metrics(), **combine(results), "train/step_s": time.perf_counter() - started}

    def plan(self, groups: Sequence[RolloutGroup], rewards: Sequence[float]) -> tuple[BatchPlan, list[BatchPlan]]:
        """The single-device trainer's plan of the whole batch, and each rank's share of its micro-batches."""
        t = self.template
        whole = t.plan(groups, rewards)
        return whole, deal(whole, self.world_size, self.pad_id)

    def collect(self, method: str, *args: Any) -> Any:
        """Call a collective worker method on every rank; rank 0's answer."""

        return self._all_ranks([getattr(w, method).remote(*args) for w in self.workers])[0]

    def state_dict(self) -> dict[str, Any]:
        """The whole training state, unsharded (rank 0 gathers it): resumable at any world size.
        For models whose state does not fit one host's memory, use `save_sharded`."""
        return {"sharded_trainer": self.collect("gathered_state")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import ray

        gathered = state.get("sharded_trainer")
        if gathered is None:
            raise ValueError("checkpoint was written by the single-device trainer; resume it with that trainer")
        ref = ray.put(gathered)  # one copy in the object store, read by every rank
        self._all_ranks([w.load_full.remote(ref) for w in self.workers])
        self.version = int(gathered["counters"]["version"])

    def shares_folder(self, folder: Path) -> bool:
        """Whether every rank sees `folder` (always on one host; on a cluster, only on a shared filesystem)."""
        probe = folder / f".ranks-see-this-{uuid.uuid4().hex}"
        probe.touch()
        try:
            return all(self._all_ranks([w.sees.remote(str(probe)) for w in self.workers]))
        finally:
            probe.unlink()

    def save_sharded(self, folder: Path) -> None:
        """Each rank writes its own shards (torch.distributed.checkpoint) into `folder`, plus the counters.
        On several machines `folder` must be a filesystem every rank sees."""

        folder.mkdir(parents=True, exist_ok=True)
        self._all_ranks([w.save_sharded.remote(str(folder / "shards")) for w in self.workers])
        torch.save(self.collect("counters"), folder / "counters.pt")

    def load_sharded(self, folder: Path) -> None:
        """Resume from `save_sharded`'s folder, written at this or any other world size."""

        counters = torch.load(folder / "counters.pt", weights_only=True)  # plain types: no code runs on load
        self._all_ranks([w.load_sharded.remote(str(folder / "shards")) for w in self.workers])
        self._all_ranks([w.set_counters.remote(counters) for w in self.workers])
        self.version = int(counters["version"])

    def close(self) -> None:
        import ray

        if self.workers and not self.lost:  # a rank lost: the others may be stuck in a collective with it
            try:
                ray.get([w.leave.remote() for w in self.workers], timeout=self.timeout_s)
            except Exception as err:  # a dead rank: killing the actors below is what matters
                log.warning("sharded trainer: leaving the process group failed: %r", err)
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        if self._group is not None:
            ray.util.remove_placement_group(self._group)
            self._group = None

    def _all_ranks(self, calls: list[Any]) -> list[Any]:
        """Every rank's answer, in rank order. The first rank that dies ends the wait at once as `TrainerLost`:
        the ranks still alive may be waiting in a collective for the dead one until the process group's timeout."""
        import ray
        from ray.exceptions import RayActorError

        waiting = list(calls)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            try:
                ray.get(done)
            except RayActorError as err:
                self.lost = True
                rank = next(i for i, call in enumerate(calls) if call == done[0])
                raise TrainerLost(
                    f"trainer rank {rank} of {self.world_size} died ({type(err).__name__}: its process or its node is "
                    "gone); its shard of the weights and optimizer state went with it, so the run stops. Its last "
                    "checkpoint has everything up to that checkpoint's step: resume=latest"
                ) from err
        return ray.get(calls)

    def _start_workers(self) -> list[Any]:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gpus = self.gpus_per_rank if ray.cluster_resources().get("GPU", 0) > 0 else 0
        bundle: dict[str, float] = {"CPU": self.cpus_per_rank, **({"GPU": gpus} if gpus else {})}
        bundles = [bundle] * self.world_size
        self._group = ray.util.placement_group(bundles, strategy="PACK")
        if not self._group.wait(timeout_seconds=self.timeout_s):
            raise RuntimeError(
                f"trainer.world_size={self.world_size}: Ray could not reserve {bundles[0]} per rank within "
                f"{self.timeout_s:.0f}s (cluster: {ray.available_resources()})"
            )
        actor = ray.remote(num_cpus=self.cpus_per_rank, num_gpus=gpus, max_restarts=0)(ShardWorker)
        compute = self._resolved_compute_dtype(gpus > 0)
        return [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=rank)
            ).remote(trainer=self.template, rank=rank, world_size=self.world_size, compute_dtype=compute)
            for rank in range(self.world_size)
        ]

    def _resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        import ray

        return "nccl" if ray.cluster_resources().get("GPU", 0) > 0 and self.gpus_per_rank > 0 else "gloo"

    def _resolved_compute_dtype(self, cuda: bool) -> str | None:
        """auto = bf16 compute on GPUs; on CPUs none (bf16 matmuls there are slow and inexact)."""
        if self.compute_dtype == "auto":
            return "bfloat16" if cuda else None
        return self.compute_dtype


TOKEN_MEANS = ("train/clip_fraction", "train/kl", "train/entropy", "train/is_", "mismatch/logprob_abs_mean",
               "mismatch/kl_k3", "mismatch/ratio_mean", "mismatch/outside_clip_fraction")


RANK_MEMORY = ("memory/device_used_gib", "memory/trainer_peak_gib")  # each rank's card: the fullest one is reported


def combine(results: list[dict[str, float]]) -> dict[str, float]:
    """The ranks' step metrics -> the whole batch's: sums and token-weighted means over ranks; the
    update's own figures (global grad norm, lr, counters) are the same on every rank. A figure some ranks
    do not report (the engine mismatch of a rank that trained only padding: it saw no sampled token) is
    combined over the ranks that do."""
    tokens = sum(r["train/tokens"] for r in results)
    reported = sorted({key for r in results for key in r})
    # Token-weighted over ranks (the by-sign clip shares are weighted by all tokens: close enough for a chart).
    weighted = {key: token_mean([r for r in results if key in r], key) for key in reported if key.startswith(TOKEN_MEANS)}
    first = results[0]
    return {
        "train/loss": sum(r["train/loss"] for r in results),
        "train/tokens": tokens,
        **weighted,
        # A rank that ran a padding micro-batch reports at least 1.0 (the loss's value for no tokens).
        **{key: max(r[key] for r in results if key in r) for key in ("train/ratio_max", "mismatch/logprob_abs_max",
                                                                      "mismatch/ratio_max", *RANK_MEMORY) if key in reported},
        **{key: first[key] for key in ("train/grad_norm", "train/update_applied", "train/skipped_updates_total", "train/lr")},
    }


def token_mean(results: list[dict[str, float]], key: str) -> float:
    """`key` averaged over these ranks, each weighted by the tokens it trained (0.0 where they trained none)."""
    tokens = sum(r["train/tokens"] for r in results)
    return sum(r[key] * r["train/tokens"] for r in results) / tokens if tokens else 0.0


def _expose_settings() -> None:
    """Show the config validator GRPOTrainer's settings as ShardedTrainer's own (signature and type hints),
    so `trainer.optimisation.lr=abc` or a misspelt key fails with every other config error, before anything loads,
    and new single-device settings need no change here."""
    own = inspect.signature(ShardedTrainer.__init__)
    single = inspect.signature(GRPOTrainer.__init__)
    params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    params += [p for name, p in single.parameters.items() if name not in ("self", "policy")]
    ShardedTrainer.__init__.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    hints = {**typing.get_type_hints(GRPOTrainer.__init__), **typing.get_type_hints(ShardedTrainer.__init__)}
    ShardedTrainer.__init__.__annotations__ = {k: v for k, v in hints.items() if k != "settings"}


_expose_settings()
