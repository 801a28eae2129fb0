"""Hold a job at a named point of a step, for tests of faults: a test SIGKILLs it there, or changes the world
(stops a tracking server) and lets it go on by removing the marker file (see `env.halt_request`).

The points: `generation` (a step's rollouts about to be taken), `reward` (the step's rollouts taken, not yet
scored), `update` (the optimizer step done, its weights neither synced nor saved), `sync` (a weight sync begun: the
placement has handed the device over, the weights not yet pushed; numbered by the policy version it pushes),
`checkpoint` (the trainer state written into a checkpoint's temporary folder, the manifest not yet). An engine in a Ray
actor also holds at the n-th call of a worker method (`grpo_receive_weights@2`: inside the second weight sync, the
trainer sending, the engine not yet receiving). A real run never sets the variable and passes each point at the cost
of one lookup.
"""

from __future__ import annotations

import logging
import time

from grpo_pipe.runtime.env import halt_request

log = logging.getLogger(__name__)


def halt_point(point: str, step: int) -> None:
    """When the environment asks for this point and step: write the marker file and wait until it is removed."""
    request = halt_request()
    if request is None or (point, step) not in request.points:
        return
    log.warning("Halted at %s@%d (GRPO_PIPE_HALT_AT) until %s is removed", point, step, request.marker)
    request.marker.write_text(f"{point}@{step}\n")
    while request.marker.exists():
        time.sleep(0.05)
