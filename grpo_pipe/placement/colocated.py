"""Engine and trainer on the same device(s), taking turns.

With `sleep_level > 0` the engine frees its memory while the trainer runs (vLLM sleep mode:
level 1 offloads weights and drops the KV cache, level 2 drops both) and is woken before the next
rollout. Weights are synced while the engine is awake.
"""

from __future__ import annotations

import torch

from grpo_pipe.config.errors import failed
from grpo_pipe.interfaces import RolloutEngine
from grpo_pipe.placement.resources import ShardedTraining
from grpo_pipe.rollout.errors import EngineGaveUp


class ColocatedPlacement:
    """`placement=colocated`: engine and trainer share the device(s) and take turns.

    Args:
        sleep_level: vLLM sleep level while the trainer runs: 0 = never sleep, 1 = offload weights and drop the KV
            cache, 2 = drop both (GPU; the engine is woken before the next rollout and before a sync).
    """

    def __init__(self, sleep_level: int = 0) -> None:
        self.sleep_level = sleep_level
        self._asleep = False

    def config_problems(self) -> list[str]:
        return failed((self.sleep_level in (0, 1, 2), f"placement.sleep_level={self.sleep_level}; allowed: 0, 1, 2"))

    def place(self, engine: RolloutEngine) -> RolloutEngine:
        return engine  # the engine lives right here, in the trainer's process

    def check(self, trainer: object) -> list[str]:
        if isinstance(trainer, ShardedTraining):
            return [
                f"trainer.world_size={trainer.world_size} with placement=colocated: the sharded trainer's ranks run "
                "in Ray actors on devices of their own, so no engine shares their device; use placement=split "
                "with weight_bridge=nccl, lora or checkpoint"
            ]
        return []

    def trainer_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

    def before_rollout(self, engine: RolloutEngine) -> None:
        self._wake(engine)

    def before_train(self, engine: RolloutEngine) -> None:
        if self.sleep_level > 0 and not self._asleep:
            engine.sleep(self.sleep_level)
            self._asleep = True

    def before_sync(self, engine: RolloutEngine) -> None:
        self._wake(engine)

    def _wake(self, engine: RolloutEngine) -> None:
        if self._asleep:
            engine.wake_up()
            self._asleep = False

    def restart_engines(self, engine: RolloutEngine, attempt: int) -> None:
        raise EngineGaveUp("the engine shares the trainer's process (placement=colocated): resume from a checkpoint")

    def close(self) -> None:
        pass  # started nothing of its own
