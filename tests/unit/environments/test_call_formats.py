"""Reading calls back: well-formed calls become arguments, malformed ones a problem the model is told."""

from __future__ import annotations

from grpo_pipe.environments.call_formats import HermesCalls, ParsedTurn, TagCalls
from grpo_pipe.environments.toolbox import Tool

CALC = Tool("calculator", {"type": "function", "function": {"name": "calculator", "description": "Exact arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}})
LOOKUP = Tool("lookup", {"type": "function", "function": {"name": "lookup", "description": "Look up.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "year": {"type": "integer"}}, "required": ["city"]}}})


def test_tag_calls_read_a_single_argument_as_written_and_several_as_json() -> None:
    tags = TagCalls()
    assert tags.parse("Let me see. <calculator> 12 * 34 </calculator>", [CALC]) == ParsedTurn(
        "calculator", {"expression": "12 * 34"})
    assert tags.parse('<lookup>{"city": "Oslo", "year": 2020}</lookup>', [LOOKUP]) == ParsedTurn(
        "lookup", {"city": "Oslo", "year": 2020})
    assert tags.parse("#### 408", [CALC]) == ParsedTurn()  # an answer: the episode ends
    assert tags.stop_strings([CALC, LOOKUP]) == ["</calculator>", "</lookup>"]
    assert tags.result_message("408") == {"role": "tool", "content": "<tool_response>408</tool_response>"}
    assert "- calculator(expression: string): Exact arithmetic." in tags.instructions([CALC])


def test_malformed_tag_calls_are_problems_for_the_model() -> None:
    tags = TagCalls()
    assert tags.parse("<calculator>12 * 34", [CALC]).problem == "the call <calculator> was not closed with </calculator>"
    assert "not a JSON object" in (tags.parse("<lookup>{city: Oslo}</lookup>", [LOOKUP]).problem or "")
    assert tags.parse('<lookup>{"year": 1}</lookup>', [LOOKUP]).problem == "lookup takes (city, year): missing city"
    assert tags.parse('<lookup>{"city": "Oslo", "x": 1}</lookup>', [LOOKUP]).problem == (
        "lookup takes (city, year): unexpected x")
    assert tags.parse('<lookup>{"city": 3}</lookup>', [LOOKUP]).problem == "lookup: city must be of type string, got 3"
    assert all(tags.parse(text, [CALC]).acts for text in ("<calculator>1+</calculator>", "<calculator>1"))


def test_hermes_calls_read_json_calls_and_name_what_is_wrong() -> None:
    hermes = HermesCalls()
    call = '<tool_call>\n{"name": "lookup", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert hermes.parse(call, [LOOKUP, CALC]) == ParsedTurn("lookup", {"city": "Oslo"})
    as_string = '<tool_call>{"name": "lookup", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>'
    assert hermes.parse(as_string, [LOOKUP]) == ParsedTurn("lookup", {"city": "Rome"})
    assert hermes.parse('<tool_call>{"name": "search", "arguments": {}}</tool_call>', [LOOKUP]).problem == (
        "no tool named 'search'; tools: lookup")
    assert "not valid JSON" in (hermes.parse("<tool_call>{oops</tool_call>", [LOOKUP]).problem or "")
    assert hermes.parse("The answer is 4.", [LOOKUP]) == ParsedTurn()
