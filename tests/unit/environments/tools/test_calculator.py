"""The calculator: exact results worked out by hand, every refusal, and its schema as transformers reads it."""

import pytest

from grpo_pipe.environments.tools.calculator import Calculator
from grpo_pipe.environments.tools.errors import ToolError


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("12 * 34", "408"),  # 12*34 = 360 + 48
        ("1 + 2 * 3", "7"),  # precedence: 2*3 first
        ("(1 + 2) * 3", "9"),
        ("2 - 9", "-7"),
        ("-7", "-7"),
        ("+5", "5"),
        ("--3", "3"),
        ("7 / 3", "7/3"),  # stays a fraction, no 2.333...
        ("6 / 4", "3/2"),  # reduced
        ("8 / 4", "2"),  # an integer when it is one
        ("-7 / 3", "-7/3"),
        ("0.1 + 0.2", "3/10"),  # decimal literals are exact: 1/10 + 2/10
        ("1.5 * 4", "6"),
        (".5 + 5.", "11/2"),
        ("2.5e2", "250"),
        ("1e-2", "1/100"),
        ("1_000 * 3", "3000"),
        ("17 // 5", "3"),
        ("-17 // 5", "-4"),  # floor, not truncation
        ("17 % 5", "2"),
        ("-17 % 5", "3"),  # the sign of the divisor, as Python does: -17 = -4*5 + 3
        ("7.5 % 2", "3/2"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "1/4"),
        ("(2/3) ** 2", "4/9"),
        ("-2 ** 2", "-4"),  # ** binds tighter than unary minus
        ("0 ** 0", "1"),
        ("2 ^ 3", "8"),  # ^ is a power, not xor
        ("6 × 7", "42"),
        ("84 ÷ 2", "42"),
        ("50 − 8", "42"),
        ("  3 + 4  ", "7"),
    ],
)
def test_exact_results(expression: str, expected: str) -> None:
    assert Calculator()(expression) == expected


def test_big_integers_are_exact() -> None:
    calculator = Calculator()
    assert calculator("2 ** 64 * 2 ** 36") == "1267650600228229401496703205376"  # 2**100
    assert calculator("2 ** 64") == "18446744073709551616"
    assert calculator("99999999999999999999 * 99999999999999999999") == "9999999999999999999800000000000000000001"
    assert calculator("(10 ** 60 + 1) - 10 ** 60") == "1"
    assert calculator("1 / 3 ** 40") == "1/12157665459056928801"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("", "empty"),
        ("   ", "empty"),
        ("1 +", "not a valid arithmetic expression"),
        ("(1 + 2", "not a valid arithmetic expression"),
        ("1 + 2)", "not a valid arithmetic expression"),
        ("1\x00", "not a valid arithmetic expression"),
        ("x + 1", "names such as 'x'"),
        ("pi", "names such as 'pi'"),
        ("abs(-1)", "function calls"),
        ("'a' * 3", "str literals"),
        ("1 < 2", "comparisons"),
        ("1 and 2", "and/or"),
        ("True + 1", "bool literals"),
        ("1j", "complex literals"),
        ("1, 2", "commas"),
        ("[1][0]", "indexing"),
        ("1 if 1 else 2", "if/else"),
        ("~1", "unary operator"),
        ("not 1", "unary operator"),
        ("1 << 2", "this operator"),
        ("6 & 3", "this operator"),
        ("2 ** 0.5", "the exponent must be an integer"),
        ("2 ** 65", "between -64 and 64"),
        ("2 ** -65", "between -64 and 64"),
        ("(10 ** 40) ** 30", "more than 1000 digits"),  # 1201 digits
        ("1e999999999999", "more than 1000 digits"),  # refused before it is built
        ("1e-1001", "more than 1000 digits"),
        ("1" + "+1" * 250, "the limit is 500"),  # 501 characters
    ],
)
def test_refusals_name_the_problem(expression: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        Calculator()(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "__import__('os').system('ls')",
        "open('x')",
        "(1).__class__",
        "(1).__class__.__bases__[0].__subclasses__()",
        "exec('1')",
        "eval('1')",
        "lambda: 1",
        "[x for x in (1, 2)]",
        "{}",
        "print(1)",
        "import os",
        "1; 2",
        "x := 1",
    ],
)
def test_code_is_never_run(expression: str) -> None:
    with pytest.raises(ToolError, match="unsupported syntax|not a valid arithmetic expression"):
        Calculator()(expression)


def test_a_non_string_is_refused() -> None:
    with pytest.raises(ToolError, match="must be a string, got int"):
        Calculator()(12)  # type: ignore[arg-type]


def test_max_operations_counts_binary_operations_only() -> None:
    calculator = Calculator(max_operations=2)
    assert calculator("1 + 2 * 3") == "7"  # two operations
    assert calculator("-(-1) + -2") == "-1"  # unary minus is free
    with pytest.raises(ToolError) as refused:
        calculator("1 + 2 + 3 + 4")
    assert str(refused.value) == (
        "this calculator takes at most 2 operation(s) per call; found 3: split the expression into several calls"
    )


def test_max_digits_bounds_literals_and_results() -> None:
    calculator = Calculator(max_digits=5)
    assert calculator("99999 / 7") == "99999/7"
    with pytest.raises(ToolError, match="more than 5 digits"):
        calculator("100000")
    with pytest.raises(ToolError, match="more than 5 digits"):
        calculator("999 * 999")  # 998001: 6 digits
    with pytest.raises(ToolError, match="more than 5 digits"):
        calculator("1 / 100000")  # the denominator counts too


@pytest.mark.parametrize(("key", "value"), [("max_operations", 0), ("max_digits", 0), ("max_digits", 10**9)])
def test_bad_settings_are_named_by_its_rules_not_raised(key: str, value: int) -> None:
    calculator = Calculator(**{key: value})  # built at once even for 10**9 digits: nothing is computed from it yet
    assert [p.split(":")[0] for p in calculator.config_problems()] == [f"{key}={value}"]


def test_the_default_settings_keep_the_rules() -> None:
    assert Calculator().config_problems() == []


def test_transformers_reads_the_schema_from_the_bound_method() -> None:
    from transformers.utils import get_json_schema

    schema = get_json_schema(Calculator().__call__)
    function = schema["function"]
    assert function["description"] == "Evaluate an arithmetic expression exactly."
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"] == {
        "type": "string",
        "description": 'The arithmetic to evaluate, e.g. "12 * 34".',
    }
