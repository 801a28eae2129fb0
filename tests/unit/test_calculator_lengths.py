"""`experiment=calculator_lengths` is what its header says: train lengths 2-4 sampled uniformly, held-out lengths 3-5,
worked examples of two different call counts, each correct; `curriculum=length_ladder` is its contrast;
`experiment=calculator_restated`'s examples are correct episodes that restate what is left before every later turn."""

from hydra.utils import instantiate

from grpo_pipe.benchmarks.call_decisions import correct_turns
from grpo_pipe.config.validate import validate_config
from grpo_pipe.curriculum.length_ladder import LengthLadderCurriculum
from grpo_pipe.curriculum.uniform import UniformCurriculum
from grpo_pipe.data.arithmetic import ArithmeticTasks, evaluate, steps
from grpo_pipe.runner.pipeline import PLAIN_KEYS, VALIDATED_GROUPS


def test_the_experiment_trains_lengths_uniformly_and_holds_out_a_length_never_trained_on(compose_cfg) -> None:
    cfg = compose_cfg(["experiment=calculator_lengths"], tiny=False)
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)
    data, curriculum = instantiate(cfg.data, _convert_="all"), instantiate(cfg.curriculum, _convert_="all")
    assert isinstance(data, ArithmeticTasks) and isinstance(curriculum, UniformCurriculum)
    assert (data.train_lengths, data.eval_lengths) == ([2, 3, 4], [3, 4, 5])
    assert data.config_problems() == [] and curriculum.config_problems() == []
    assert cfg.run.eval_size == cfg.data.eval_size  # every held-out task evaluated: 100 per length
    # Five terms need four calls and the answer.
    assert cfg.environment.max_turns >= max(data.eval_lengths)
    contrast = compose_cfg(["experiment=calculator_lengths", "curriculum=length_ladder"], tiny=False)
    validate_config(contrast, VALIDATED_GROUPS, PLAIN_KEYS)
    ladder = instantiate(contrast.curriculum, _convert_="all")
    assert isinstance(ladder, LengthLadderCurriculum)
    assert (ladder.prompts_per_step, ladder.samples_per_prompt) == (curriculum.prompts_per_step,
                                                                   curriculum.samples_per_prompt)


def test_the_worked_examples_show_two_call_counts_one_operation_a_call_and_the_right_answers(compose_cfg) -> None:
    messages = list(compose_cfg(["experiment=calculator_lengths"], tiny=False).environment.demonstration)
    examples: list[list[dict]] = []
    for message in messages:
        if message["role"] == "user":
            examples.append([])
        examples[-1].append(message)
    calls = []
    for example in examples:
        expression = example[0]["content"].removeprefix("Calculate ").rstrip(".").split()
        answer = evaluate([int(n) for n in expression[::2]], expression[1::2])
        made = [m["content"] for m in example if m["role"] == "assistant" and m["content"].startswith("<calculator>")]
        assert all(len(call.split()) == 3 for call in made)  # one operation per call, as the calculator allows
        assert len(made) == len(expression) // 2  # as many calls as operations
        assert example[-1] == {"role": "assistant", "content": f"#### {answer}"}
        calls.append(len(made))
    assert len(set(calls)) == len(calls) == 2  # two examples, two different counts
    # No example has the four calls of a five-term task: that length measures following the task, not copying one.
    assert 4 not in calls


def test_the_restated_examples_are_correct_episodes_that_restate_what_is_left_before_every_later_turn(compose_cfg) -> None:
    cfg = compose_cfg(["experiment=calculator_restated"], tiny=False)
    validate_config(cfg, VALIDATED_GROUPS, PLAIN_KEYS)
    assert (instantiate(cfg.data, _convert_="all").train_lengths) == [3, 4]
    examples: list[list[dict]] = []
    for message in cfg.environment.demonstration:
        if message["role"] == "user":
            examples.append([])
        examples[-1].append(dict(message))
    for example in examples:
        question = example[0]["content"]
        expression = question.removeprefix("Calculate ").rstrip(".").split()
        # As the call-decision benchmark plays a correct episode with the lead-in before calls and the answer alike.
        scripted = correct_turns(question, "calculator", "Now {left}. ", restate_answer=True)
        assert [m["content"] for m in example if m["role"] == "assistant"] == [t.text for t in scripted]
        results = [m["content"] for m in example if m["role"] == "tool"]
        assert results == [f"<tool_response>{v}</tool_response>" for v in steps([int(n) for n in expression[::2]],
                                                                                expression[1::2])]
