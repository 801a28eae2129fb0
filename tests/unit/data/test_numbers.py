"""Numbers read exactly as answers write them, and what is not one number is not read as another."""

from grpo_pipe.data.numbers import parse_number


def test_commas_currency_percent_and_fractions_read_as_exact_numbers() -> None:
    assert parse_number("1,200") == parse_number("1200.0") == 1200
    assert parse_number("$1,200.50") == parse_number("1200.5")
    assert parse_number("50%") == 50 and parse_number("-(3)/(4)") == parse_number("-0.75") == parse_number("-3/4")
    assert parse_number(".5") == parse_number("1/2") and parse_number("\u22127") == -7


def test_non_numbers_are_unparsable_not_another_number() -> None:
    for answer in ("1,2", "1e3", "nan", "inf", "x+1", "(1)/(0)", "1/2/3"):
        assert parse_number(answer) is None, answer
