"""A verifiers environment as an Atropos environment process: run by the verifiers environment's own Python (verifiers
0.4 and vLLM cannot share one: their `openai` and `mcp` pins disagree), as a script, so it imports only the standard
library, `httpx` and `verifiers` (with its `renderers`), never `grpo_pipe`.

It loads the environment (`--vf.name`, a taskset id; `--vf.args`, the rest of its config as JSON), registers with
Atropos's API server as an environment and loops: a task, `group_size` rollouts of it through the run's endpoint with
verifiers' train client (it renders the chat itself and sends token ids to `/inference/v1/generate`, so every sampled
token is the engine's own), scored by the taskset's rubric; each group goes to the API as Atropos scored data. The
trainer checks every trained span against what the engine served (`episodes.scored_groups`): this process is trusted
with nothing but the scores.

A trace is a list of branches, each one token sequence (prompt, then sampled and environment tokens; `sampled_mask`
says which the model sampled). A renderer that bridges turns (`--vf.renderer`, a `renderers` config, names one) gives
one branch per episode; one that cannot (the default renderer) gives one branch per model turn. Branch k of each
rollout of a task forms one group, scored with each rollout's reward: every group has exactly `group_size` sequences,
as Atropos batches them. A branch position that not every rollout reached, or a rollout that failed, is left out and
said in the log.

    PYTHON verifiers_worker.py --vf.name TASKSET --vf.args '{"agent": {"harness": {"id": "..."}}}' \
        --env.rollout_server_url URL --env.tokenizer_name DIR --env.group_size 4 \
        --openai.base_url ENDPOINT/v1 --openai.api_key TOKEN --openai.model_name NAME \
        --vf.temperature 1.0 --vf.max_tokens 64 [--vf.renderer '{"name": "qwen3"}']
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # Not this script's folder, whose verifiers.py would shadow the package, but the folder the run started in: an
    # environment may be a module there.
    sys.path[0] = os.getcwd()

import httpx  # noqa: E402 - after the path is set

log = logging.getLogger("grpo_pipe.verifiers_worker")

NOT_TRAINED = -100  # Atropos's mask value for a token that gets no loss
KEY_VARIABLE = "GRPO_PIPE_ENDPOINT_TOKEN"  # where verifiers' train client reads the endpoint's token from
DEFAULTS: dict[str, Any] = {"agent": {"runtime": {"type": "subprocess"}}}  # run the harness here, not in a sandbox


def environment_config(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """verifiers' env config: the taskset `name`, `args` merged over the defaults (a harness in this process)."""
    return _merged(_merged(DEFAULTS, {"taskset": {"id": name}}), args)


def scored_groups(branches: Sequence[Sequence[tuple[Sequence[int], Sequence[bool]]]], rewards: Sequence[float],
                  env_id: int | None) -> tuple[list[dict[str, Any]], int]:
    """Atropos scored data for one task's rollouts: `branches[r]` is rollout r's (token_ids, sampled_mask) per branch,
    `rewards[r]` its reward. Group k holds branch k of every rollout; returns the groups and how many branch positions
    were left out because not every rollout reached them. A reward that is not a finite number (a rubric's NaN) raises
    ValueError: JSON cannot carry it to the trainer, which would refuse it anyway."""
    if not all(math.isfinite(r) for r in rewards):
        raise ValueError(f"the rubric's rewards are not all finite numbers: {list(rewards)}")
    reached = min((len(b) for b in branches), default=0)
    groups = []
    for position in range(reached):
        pairs = [rollout[position] for rollout in branches]
        groups.append({"tokens": [list(ids) for ids, _ in pairs],
                       "masks": [[t if sampled else NOT_TRAINED for t, sampled in zip(ids, mask)] for ids, mask in pairs],
                       "scores": [float(r) for r in rewards], "env_id": env_id})
    return groups, max((len(b) for b in branches), default=0) - reached


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) else value
    return out


class AtroposEnvironmentClient:
    """This process as one environment of Atropos's API server.

    Args:
        url: The API server's base URL.
        name: The name this environment registers under.
        group_size: Rollouts per scored group it posts.
        max_token_length: The longest sequence it posts, in tokens.
    """

    def __init__(self, url: str, name: str, group_size: int, max_token_length: int) -> None:
        self.http = httpx.AsyncClient(base_url=url.rstrip("/"), timeout=60.0)
        self.name, self.group_size, self.max_token_length = name, group_size, max_token_length
        self.env_id: int | None = None
        self.batch_size = 0

    async def register(self, poll_s: float = 0.5) -> None:
        """Waits until the trainer has asked for its first batch (Atropos takes environments only then)."""
        body = {"max_token_length": self.max_token_length, "desired_name": self.name, "weight": 1.0,
                "group_size": self.group_size}
        while True:
            answer = (await self.http.post("/register-env", json=body)).json()
            if answer.get("status") == "success":
                self.env_id = int(answer["env_id"])
                self.batch_size = int((await self.http.get("/info")).json().get("batch_size", 0))
                log.info("registered with the Atropos API as environment %d (batches of %d)", self.env_id,
                         self.batch_size)
                return
            await asyncio.sleep(poll_s)

    async def wait_for_room(self, poll_s: float = 0.5) -> None:
        """Sample no further ahead than a batch: what waits in the queue only grows stale."""
        while True:
            queued = int((await self.http.get("/status")).json().get("queue_size", 0))
            if queued * self.group_size < max(self.batch_size, self.group_size):
                return
            await asyncio.sleep(poll_s)

    async def post(self, group: Mapping[str, Any]) -> None:
        (await self.http.post("/scored_data", json=group)).raise_for_status()


async def serve(options: argparse.Namespace) -> None:
    import verifiers.v1 as vf  # pyright: ignore[reportMissingImports]  # only in the verifiers environment's Python

    os.environ[KEY_VARIABLE] = options.api_key
    env = vf.load_environment(vf.resolve_env_config(environment_config(options.name, json.loads(options.args))))
    tasks = list(env.taskset)
    if not tasks:
        raise SystemExit(f"verifiers environment {options.name!r} has no tasks")
    log.info("loaded verifiers environment %s: %d tasks", options.name, len(tasks))
    client = vf.TrainClientConfig(base_url=options.base_url, api_key_var=KEY_VARIABLE,
                                  renderer_model_name=options.tokenizer, renderer=json.loads(options.renderer or "null"))
    check_renderer(client.renderer, options.tokenizer)
    ctx = vf.ModelContext(model=options.model_name, client=client,
                          sampling=vf.Sampling(temperature=options.temperature, max_tokens=options.max_tokens))
    api = AtroposEnvironmentClient(options.api_url, options.name, options.group_size, options.max_token_length)
    await api.register()
    rng = random.Random(options.seed)
    async with env.serving():
        while True:
            await api.wait_for_room()
            task = rng.choice(tasks)
            episodes = await asyncio.gather(*(env.run_slot(s, ctx) for s in env.slots(task, options.group_size)))
            traces = [e.traces[-1] if e.traces else None for e in episodes]
            failed = [str(e.errors[:1]) for e, t in zip(episodes, traces) if t is None or not t.branches]
            if failed:
                log.warning("task %s: %d rollouts failed, group not posted: %s", task.data.id, len(failed), failed[0])
                continue
            branches = [[(b.token_ids, b.sampled_mask) for b in t.branches if b.trainable] for t in traces if t is not None]
            try:
                groups, left_out = scored_groups(branches, [float(t.reward) for t in traces if t is not None],
                                                 api.env_id)
            except ValueError as err:
                log.warning("task %s: group not posted: %s", task.data.id, err)
                continue
            if left_out:
                log.warning("task %s: %d turns not every rollout reached were left out", task.data.id, left_out)
            for group in groups:
                await api.post(group)


def check_renderer(renderer: Any, tokenizer: str) -> None:
    """Exits saying why when the renderer cannot be built for the model's tokenizer (a family's renderer needs its
    special tokens): verifiers would otherwise fail every rollout on it, one by one."""
    from renderers import create_renderer  # pyright: ignore[reportMissingImports]  # verifiers' dependency
    from renderers.base import load_tokenizer  # pyright: ignore[reportMissingImports]

    try:
        create_renderer(load_tokenizer(tokenizer), renderer)
    except Exception as err:  # whatever the renderer's own checks raise
        name = getattr(renderer, "name", "auto")
        raise SystemExit(f"renderer {name!r} cannot render for the tokenizer at {tokenizer}: {err}") from err


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The flags the run passes (those of an Atropos environment, and `--vf.*`); others are ignored."""
    parser = argparse.ArgumentParser(description="a verifiers environment as an Atropos environment process")
    parser.add_argument("--vf.name", dest="name", required=True)
    parser.add_argument("--vf.args", dest="args", default="{}")
    parser.add_argument("--vf.temperature", dest="temperature", type=float, default=1.0)
    parser.add_argument("--vf.max_tokens", dest="max_tokens", type=int, default=64)
    parser.add_argument("--vf.seed", dest="seed", type=int, default=0)
    parser.add_argument("--vf.renderer", dest="renderer", default=None,
                        help="verifiers' TrainClientConfig.renderer as JSON; default: resolved by the tokenizer's name")
    parser.add_argument("--env.rollout_server_url", dest="api_url", required=True)
    parser.add_argument("--env.tokenizer_name", dest="tokenizer", required=True)
    parser.add_argument("--env.group_size", dest="group_size", type=int, default=8)
    parser.add_argument("--env.max_token_length", dest="max_token_length", type=int, default=4096)
    parser.add_argument("--openai.base_url", dest="base_url", required=True)
    parser.add_argument("--openai.api_key", dest="api_key", default=None)
    parser.add_argument("--config", dest="config", default=None,
                        help="a JSON file of settings by namespace; the run passes the endpoint's token this way")
    parser.add_argument("--openai.model_name", dest="model_name", required=True)
    options, _ = parser.parse_known_args(argv)
    if options.api_key is None and options.config is not None:
        options.api_key = json.loads(Path(options.config).read_text()).get("openai", {}).get("api_key")
    if options.api_key is None:
        parser.error("the endpoint's token: give --openai.api_key, or --config with openai.api_key")
    return options


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(parse(sys.argv[1:])))
