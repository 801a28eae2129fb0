"""The `calculator` tool (`environment.tools=[calculator]`): exact arithmetic for a model, big integers and
fractions, nothing else.

The expression is parsed with `ast` and only a whitelist of nodes (numbers, unary +/-, + - * / // % **,
parentheses) is evaluated, so no name, call or attribute ever runs: the tool is safe on any model output.
Every value is a `fractions.Fraction`, so "0.1 + 0.2" is exactly 3/10 and 2**64 * 2**36 keeps all its digits.
"""

from __future__ import annotations

import ast
import functools
import operator
import re
import sys
from collections.abc import Callable
from fractions import Fraction

from grpo_pipe.config.errors import failed
from grpo_pipe.environments.tools.errors import ToolError

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 64  # |exponent| of **: with max_digits this bounds the work of one power
# Models write the symbols they read in books; "^" is a power in that notation, never xor.
_NORMALISE = str.maketrans({"×": "*", "÷": "/", "−": "-", "^": "**"})
_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction | int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
# A decimal literal's text: digits, an optional fraction part and an optional exponent.
_DECIMAL = re.compile(r"(?P<int>\d*)(?:\.(?P<frac>\d*))?(?:[eE](?P<exp>[+-]?\d+))?")
_ALLOWED = "use only numbers, + - * / // % ** and parentheses"


class Calculator:
    """Evaluates arithmetic exactly; every problem comes back as a `ToolError` the model can read.

    Args:
        max_operations: the most binary operations one call may hold (None: no limit), to make a model
            show its steps as several calls.
        max_digits: the most digits a numerator or denominator may have, literals and results alike.
    """

    def __init__(self, *, max_operations: int | None = None, max_digits: int = 1000) -> None:
        self.max_operations = max_operations
        self.max_digits = max_digits

    def config_problems(self) -> list[str]:
        """The settings' own rules, each named by its setting (the toolbox puts them under `tool_options.calculator`)."""
        # str() of a bigger integer needs sys.set_int_max_str_digits, a process-wide setting we leave alone.
        str_limit = sys.get_int_max_str_digits() or sys.maxsize
        return failed(
            (self.max_operations is None or self.max_operations >= 1,
             f"max_operations={self.max_operations!r}: must be null (no limit) or >= 1"),
            (1 <= self.max_digits <= str_limit,
             f"max_digits={self.max_digits!r}: allowed 1 <= max_digits <= {str_limit} (Python's digit limit of str())"),
        )

    @functools.cached_property
    def _bound(self) -> int:
        """The smallest number with max_digits + 1 digits (built at the first call, after the settings were checked)."""
        return 10**self.max_digits

    def __call__(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: The arithmetic to evaluate, e.g. "12 * 34".
        """
        tree, text = self._parse(expression)
        operations = sum(isinstance(node, ast.BinOp) for node in ast.walk(tree))
        if self.max_operations is not None and operations > self.max_operations:
            raise ToolError(
                f"this calculator takes at most {self.max_operations} operation(s) per call; found {operations}: "
                "split the expression into several calls"
            )
        return _format(self._evaluate(tree.body, text))

    def _parse(self, expression: str) -> tuple[ast.Expression, str]:
        """The expression's syntax tree and the normalised text it was parsed from (literals are read from it)."""
        if not isinstance(expression, str):
            raise ToolError(f"the expression must be a string, got {type(expression).__name__}")
        text = expression.translate(_NORMALISE).strip()
        if not text:
            raise ToolError("the expression is empty")
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise ToolError(f"the expression is {len(expression)} characters long; the limit is {MAX_EXPRESSION_CHARS}")
        try:
            return ast.parse(text, mode="eval"), text
        except SyntaxError as error:
            raise ToolError(f"not a valid arithmetic expression: {error.msg}") from None
        except ValueError as error:  # e.g. a NUL character
            raise ToolError(f"not a valid arithmetic expression: {error}") from None

    def _evaluate(self, node: ast.expr, source: str) -> Fraction:
        """The exact value of a whitelisted node; anything else is refused by name."""
        if isinstance(node, ast.Constant):
            return self._literal(node, source)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            value = self._evaluate(node.operand, source)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and (isinstance(node.op, ast.Pow) or type(node.op) in _BINARY):
            left, right = self._evaluate(node.left, source), self._evaluate(node.right, source)
            return self._checked(self._binary(node.op, left, right))
        raise ToolError(f"unsupported syntax: {_describe(node)}; {_ALLOWED}")

    def _literal(self, node: ast.Constant, source: str) -> Fraction:
        """An int or decimal literal as an exact Fraction ("0.1" is 1/10, not the float nearest to it)."""
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolError(f"unsupported syntax: {_describe(node)}; {_ALLOWED}")
        if isinstance(value, int):
            return self._checked(Fraction(value))
        text = (ast.get_source_segment(source, node) or "").replace("_", "")
        match = _DECIMAL.fullmatch(text)
        if match is None:  # the parser accepted it as a float, so this is only a guard
            raise ToolError(f"unsupported number: {text!r}")
        digits = len(match["int"]) + len(match["frac"] or "")
        # 1e999999999 would take minutes to build: bound the exponent by the digits it could produce first.
        if abs(int(match["exp"] or 0)) > self.max_digits + digits:
            raise ToolError(f"the number {text} has more than {self.max_digits} digits")
        return self._checked(Fraction(text))

    def _binary(self, op: ast.operator, left: Fraction, right: Fraction) -> Fraction:
        """`left op right`; a zero divisor is the model's mistake, so it is a ToolError."""
        try:
            if isinstance(op, ast.Pow):
                return self._power(left, right)
            return Fraction(_BINARY[type(op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None

    def _power(self, base: Fraction, exponent: Fraction) -> Fraction:
        """`base ** exponent` for a small integer exponent (a fractional one is rarely exact)."""
        if exponent.denominator != 1:
            raise ToolError(f"the exponent must be an integer, got {_format(exponent)}")
        if abs(exponent) > MAX_EXPONENT:
            raise ToolError(f"the exponent must be between -{MAX_EXPONENT} and {MAX_EXPONENT}, got {_format(exponent)}")
        return Fraction(base**exponent.numerator)

    def _checked(self, value: Fraction) -> Fraction:
        """`value`, unless its numerator or denominator has more than max_digits digits."""
        if abs(value.numerator) >= self._bound or value.denominator >= self._bound:
            raise ToolError(f"a number has more than {self.max_digits} digits (the limit)")
        return value


TOOL = Calculator  # the tool this module ships, under the module's name


def _format(value: Fraction) -> str:
    """An integer as "408", anything else as the reduced fraction "7/3"."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator}"


def _describe(node: ast.AST) -> str:
    """What a refused node is, in the words a model would use."""
    if isinstance(node, ast.Name):
        return f"names such as {node.id!r}"
    if isinstance(node, ast.Constant):
        return f"{type(node.value).__name__} literals such as {node.value!r}"
    kinds = {
        ast.Call: "function calls",
        ast.Attribute: "attributes",
        ast.Compare: "comparisons",
        ast.BoolOp: "and/or",
        ast.Subscript: "indexing",
        ast.Lambda: "lambdas",
        ast.Tuple: "commas (tuples)",
        ast.IfExp: "if/else",
        ast.UnaryOp: "this unary operator",
        ast.BinOp: "this operator",
    }
    return kinds.get(type(node), type(node).__name__)
