"""Held-out metrics per group of tasks (task lengths): accuracy, reward, calls against operations, and the order
that puts one episode of every group on the page people read."""

from pathlib import Path

from grpo_pipe.data.arithmetic import ArithmeticTasks
from grpo_pipe.environments.transcripts import write_episode_page
from grpo_pipe.evaluation.by_group import group_metrics, in_turn
from grpo_pipe.evaluation.held_out import EvalPlan, evaluate_completions
from grpo_pipe.types import Completion, EpisodeLog, RequestTelemetry, RewardOutput, Task
from tests.fakes import ExactReward, FakeEngine, FakeTokenizer


def _task(uid: str, group: str | None, operations: int | None = None) -> Task:
    metadata = {k: v for k, v in (("eval_group", group), ("operations", operations)) if v is not None}
    return Task(uid=uid, question=uid, answer="1", metadata=metadata)


def _episode(calls: int) -> Completion:
    log = EpisodeLog(turns=(), model_turns=calls + 1, tool_calls=calls)
    return Completion(token_ids=(1,), logprobs=(-0.1,), text="#### 1", finish_reason="stop", policy_version=0,
                      telemetry=RequestTelemetry(prompt_tokens=1, generated_tokens=1, cached_prompt_tokens=0), episode=log)


def test_accuracy_reward_and_calls_per_group_worked_by_hand() -> None:
    tasks = [_task("a", "terms_2", 1), _task("b", "terms_2", 1), _task("c", "terms_3", 2), _task("d", "terms_3", 2),
             _task("e", "terms_3", 2), _task("f", None)]
    completions = [_episode(1), _episode(2), _episode(2), _episode(2), _episode(1), _episode(0)]
    correct = [True, True, True, False, True, True]
    scored = RewardOutput(values=[1.0, 1.0, 1.5, 0.5, 1.0, 1.0], terms={}, correct=correct)
    metrics = group_metrics(tasks, completions, scored)
    assert metrics == {
        "eval/reward/mean/terms_2": 1.0, "eval/accuracy/terms_2": 1.0,
        "eval/reward/mean/terms_3": 1.0, "eval/accuracy/terms_3": 2 / 3,
        # solved episodes of tasks that say their operations: a (1 call, 1 op) b (2, 1) c (2, 2) e (1, 2); f says none
        "eval/calls_match": 2 / 4, "eval/calls_match/terms_2": 1 / 2, "eval/calls_match/terms_3": 1 / 2,
    }


def test_no_groups_and_no_notion_of_solved_log_only_what_they_can() -> None:
    tasks = [_task("a", None), _task("b", None)]
    assert group_metrics(tasks, [_episode(1), _episode(1)], RewardOutput(values=[1.0, 0.0], terms={}, correct=[True,
                                                                                                               False])) == {}
    grouped = [_task("a", "x", 1), _task("b", "x", 1)]
    assert group_metrics(grouped, [_episode(1), _episode(1)], RewardOutput(values=[1.0, 0.0], terms={})) == {
        "eval/reward/mean/x": 0.5}


def test_groups_take_turns_each_in_its_own_order() -> None:
    tasks = [_task("a3", "3"), _task("b3", "3"), _task("c3", "3"), _task("a4", "4"), _task("a5", "5"), _task("b5", "5")]
    assert [t.uid for t in in_turn(tasks, tasks)] == ["a3", "a4", "a5", "b3", "b5", "c3"]
    plain = [_task("x", None), _task("y", None)]
    assert in_turn(["px", "py"], plain) == ["px", "py"]


def test_held_out_lengths_in_turn_are_each_reported_and_the_page_shows_one_episode_of_each(tmp_path: Path) -> None:
    # Held-out lengths 3, 4 and 5, given shortest first as a file might hold them: taken in turn, as the run does.
    data = ArithmeticTasks(terms=2, eval_terms=[3, 5], train_size=10, eval_size=12, seed=0)
    tasks = sorted(data.eval_tasks(), key=lambda t: t.metadata["operations"])
    # FakeEngine answers "<first number + 1>" to the question "<first number> + ...": right for the tasks made so.
    tasks = [Task(uid=t.uid, question=f"{i} + {t.question}", answer=str(i + 1 if i % 3 else 0), metadata=t.metadata) for i,
             t in enumerate(tasks)]
    tasks = in_turn(tasks, tasks)
    assert [t.metadata["eval_group"] for t in tasks[:3]] == ["terms_3", "terms_4", "terms_5"]
    prompts = [tuple(FakeTokenizer()(t.question)["input_ids"]) for t in tasks]
    metrics, _ = evaluate_completions(FakeEngine(), prompts, tasks, ExactReward(), EvalPlan(max_tokens=8))
    # Tasks 0..3 were three terms, 4..7 four, 8..11 five; those at a multiple of 3 have a wrong reference.
    assert metrics["eval/accuracy/terms_3"] == 2 / 4 and metrics["eval/accuracy/terms_4"] == 3 / 4
    assert metrics["eval/accuracy/terms_5"] == 3 / 4 and metrics["eval/accuracy"] == 8 / 12
    page = write_episode_page([_episode(t.metadata["operations"]) for t in tasks], tasks, 3, tmp_path)
    assert page is not None
    text = page.read_text()
    for task in tasks[:3]:
        assert f"`{task.uid}`" in text and f"**Task:** {task.question}" in text
