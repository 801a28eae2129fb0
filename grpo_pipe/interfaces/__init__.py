"""The Protocols the recipe talks to. Nothing else lives here.

Each config group option builds one object that satisfies one of these. Construction is cheap and
safe on any machine; heavy work (loading models, starting engines) happens in `connect`/`setup`.

One module per role: sources, engines, episodes, weights (policy and bridge), rewards, training (loss, trainer,
placement), records (checkpoints, tracker). Import them from here.
"""

from grpo_pipe.interfaces.engines import (
    AdapterEngine,
    GeneratesInBackground,
    InProcessModelEngine,
    LocalEngine,
    MemoryAdapterEngine,
    PendingRollout,
    RolloutEngine,
    WorkerRpcEngine,
)
from grpo_pipe.interfaces.environments import Environment
from grpo_pipe.interfaces.records import CheckpointStore, ChecksItsConfig, Tracker
from grpo_pipe.interfaces.rewards import (
    HasSourceFiles,
    ReadsRequestTimestamps,
    RecordsRequestTimestamps,
    Reward,
    TriesOnTasks,
    reads_request_timestamps,
)
from grpo_pipe.interfaces.sources import (
    ChecksTasks,
    Curriculum,
    ModelSource,
    ProvidesRollouts,
    ReportsEvaluations,
    RolloutSource,
    RolloutSourceFactory,
    TaskSource,
)
from grpo_pipe.interfaces.training import Placement, PolicyLoss, SamplingCorrection, ShardedState, Trainer
from grpo_pipe.interfaces.weights import AdapterPolicy, ModulePolicy, Policy, SendingPolicy, WeightBridge

__all__ = [
    "AdapterEngine",
    "MemoryAdapterEngine",
    "AdapterPolicy",
    "CheckpointStore",
    "ChecksItsConfig",
    "ChecksTasks",
    "Curriculum",
    "Environment",
    "ProvidesRollouts",
    "GeneratesInBackground",
    "HasSourceFiles",
    "InProcessModelEngine",
    "LocalEngine",
    "ModelSource",
    "ModulePolicy",
    "PendingRollout",
    "Placement",
    "Policy",
    "PolicyLoss",
    "ReadsRequestTimestamps",
    "ReportsEvaluations",
    "RecordsRequestTimestamps",
    "Reward",
    "RolloutEngine",
    "SendingPolicy",
    "RolloutSource",
    "RolloutSourceFactory",
    "SamplingCorrection",
    "ShardedState",
    "TaskSource",
    "Tracker",
    "Trainer",
    "TriesOnTasks",
    "WeightBridge",
    "WorkerRpcEngine",
    "reads_request_timestamps",
]
