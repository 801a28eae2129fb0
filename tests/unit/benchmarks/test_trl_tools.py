"""TRL's view of our tool episodes: the same prompt tokens, calls rendered and read back in our format, our tools
behind TRL's functions, our checker's answer; and every setting TRL's tool loop could not mirror, named."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import get_json_schema

from grpo_pipe.benchmarks.trl_tools import EnvironmentWithTools, final_answer, tool_peer, tool_peer_problems
from grpo_pipe.config.errors import ConfigError
from grpo_pipe.environments.call_formats import HermesCalls
from grpo_pipe.environments.tool_environment import ToolEnvironment
from grpo_pipe.models.tiny_random import TinyRandomModel
from grpo_pipe.types import Task
from tests.conftest import REPO
from tests.fixtures.calculator_demo import DEMONSTRATION, SYSTEM

TASKS = [Task(uid=f"t/{i}", question=f"Calculate {i} * 12 + 7.", answer=str(i * 12 + 7)) for i in range(5)]
# SmolLM2-135M-Instruct's own chat template: ChatML that adds a system message where a conversation has none.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(params=["tiny", "smollm2"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(TinyRandomModel().materialize())
    if request.param == "smollm2":
        tokenizer.chat_template = SMOLLM2_TEMPLATE
    return tokenizer


def _episodes(tokenizer: Any, **settings: Any) -> ToolEnvironment:
    episodes = ToolEnvironment(tools=["calculator"], tool_options={"calculator": {"max_operations": 1}},
                               demonstration=DEMONSTRATION, **settings)
    episodes.setup(tokenizer, SYSTEM, 1024)
    return episodes


def test_trls_prompts_are_token_for_token_those_our_episodes_start_from(tokenizer: Any) -> None:
    episodes = _episodes(tokenizer)
    assert isinstance(episodes, EnvironmentWithTools)
    peer = tool_peer(episodes, tokenizer, SYSTEM)
    conversations = [peer.conversation(task) for task in TASKS]
    assert [m["role"] for m in conversations[0]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    theirs = peer.prompt_ids(peer.tokenizer(TinyRandomModel().materialize()), conversations)  # TRL's own call
    assert theirs == [list(episodes.render_prompt(task)) for task in TASKS]


def test_the_tool_template_is_the_models_chatml_with_calls_in_our_format(tokenizer: Any) -> None:
    peer = tool_peer(_episodes(tokenizer), tokenizer, SYSTEM)
    user_first = [{"role": "user", "content": "hi"}]
    assert (tokenizer.apply_chat_template(user_first, tokenize=False, chat_template=peer.chat_template)
            == tokenizer.apply_chat_template(user_first, tokenize=False))  # SmolLM2's own system message stays
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3 * 25"}}}]}
    rendered = tokenizer.apply_chat_template([*user_first, call], tools=peer.functions, tokenize=False,
                                             chat_template=peer.chat_template)
    assert rendered.endswith("<|im_start|>assistant\n<calculator>3 * 25</calculator><|im_end|>\n")
    unknown = {**call, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"key": "value"}}}]}
    rendered = tokenizer.apply_chat_template([*user_first, unknown], tokenize=False, chat_template=peer.chat_template)
    assert rendered.endswith('<f>{"key": "value"}</f><|im_end|>\n')  # TRL's check for tool support sees key and value


def test_the_response_template_reads_our_calls_and_answers_back(tokenizer: Any) -> None:
    peer = tool_peer(_episodes(tokenizer), tokenizer, SYSTEM)
    tokenizer.response_template = peer.response_template
    prefix = "<|im_start|>user\nCalculate 3 * 25.<|im_end|>\n<|im_start|>assistant\n"

    def parse(text: str) -> dict[str, Any]:
        return tokenizer.parse_response(text, prefix=prefix, tools=peer.functions)

    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "3 * 25"}}}
    assert parse("<calculator> 3 * 25 </calculator><|im_end|>") == {"role": "assistant", "tool_calls": [call]}
    assert parse("#### 75<|im_end|>") == {"role": "assistant", "content": "#### 75"}
    assert parse("<calculator>75</calculator>")["tool_calls"][0]["function"]["arguments"] == {"expression": "75"}


def test_trls_tools_are_ours_behind_the_same_schema_and_result_message(tokenizer: Any) -> None:
    episodes = _episodes(tokenizer, max_result_chars=12)
    [calculator] = tool_peer(episodes, tokenizer, SYSTEM).functions
    assert calculator.__name__ == "calculator" and get_json_schema(calculator) == episodes.tools[0].schema
    assert calculator(expression="3 * 25") == "<tool_response>75</tool_response>"
    assert calculator(expression="1 + 2 * 3").startswith("<tool_response>error: this calcul")  # one operation per call
    assert calculator(expression="10 ** 20") == (  # our result limit, in our words
        "<tool_response>100000000000\n[truncated: 12 of 21 characters shown]</tool_response>")


def test_the_answer_graded_is_the_last_assistant_turn_when_it_calls_nothing() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "c"}}]}
    result = {"role": "tool", "name": "c", "content": "<tool_response>75</tool_response>"}
    answer = {"role": "assistant", "content": "#### 75"}
    assert final_answer([call, result, answer]) == "#### 75"
    assert final_answer([call, result, call]) == ""  # TRL's last round ended on a call: no answer, as ours at max_turns
    assert final_answer([call, result]) == "" and final_answer([]) == ""  # the next turn did not fit


def test_what_trls_tool_loop_cannot_mirror_is_named(tokenizer: Any) -> None:
    assert tool_peer_problems(_episodes(tokenizer)) == []
    hermes = _episodes(tokenizer, call_format=HermesCalls())
    assert tool_peer_problems(hermes) == ["call_format=HermesCalls: the peer reads <NAME>ARGUMENT</NAME> calls (TagCalls)"]
    several = ToolEnvironment(tools=["calculator", f"{REPO}/tests/fixtures/tools/my_tools.py:lookup"])
    several.setup(tokenizer, SYSTEM, 1024)
    with pytest.raises(ConfigError, match=r"calculator\(expression\), lookup\(.*one argument, of the same name"):
        tool_peer(several, tokenizer, SYSTEM)


def test_a_trl_episode_reads_as_ours_for_a_reward_that_reads_turns() -> None:
    from grpo_pipe.benchmarks.trl_tools import episode_log
    from grpo_pipe.environments.call_formats import TagCalls

    messages = [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calculator",
                                                                          "arguments": {"expression": "3 * 25"}}}]},
        {"role": "tool", "name": "calculator", "content": "<tool_response>75</tool_response>"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calculator", "arguments": {}}}]},
        {"role": "tool", "name": "calculator", "content": "<tool_response>error: division by zero</tool_response>"},
        {"role": "assistant", "content": "#### 89"},
    ]
    log = episode_log(messages, TagCalls())
    assert [(t.role, t.text, t.outcome) for t in log.turns if t.role == "tool"] == [
        ("tool", "75", "ok"), ("tool", "error: division by zero", "error")]
    assert (log.model_turns, log.tool_calls, log.tool_errors, log.answer) == (3, 2, 1, "#### 89")
    assert log.turns[0].text == "<calculator>3 * 25</calculator>" and log.turns[0].tool == "calculator"
