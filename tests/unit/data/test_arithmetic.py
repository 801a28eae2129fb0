"""Generated arithmetic: the usual precedence, seeded, train and eval apart."""


from grpo_pipe.data.arithmetic import ArithmeticTasks, evaluate, steps


def test_multiplication_comes_first_then_left_to_right() -> None:
    assert evaluate([19, 45, 26, 98], ["+", "-", "*"]) == 19 + 45 - 26 * 98 == -2484
    assert evaluate([10, 58, 70, 76], ["-", "-", "+"]) == -42
    assert evaluate([47, 77, 60, 80], ["*", "+", "*"]) == 8419


def test_tasks_are_seeded_answered_and_the_splits_never_overlap() -> None:
    data = ArithmeticTasks(terms=3, min_digits=2, max_digits=3, train_size=300, eval_size=50, seed=4)
    train, held_out = data.train_tasks(), data.eval_tasks()
    assert len(train) == 300 and len(held_out) == 50
    assert not {t.question for t in train} & {t.question for t in held_out}
    assert [t.question for t in train] == [t.question for t in ArithmeticTasks(terms=3, train_size=300, seed=4).train_tasks()]
    for task in train[:50]:
        expression = task.question.removeprefix("Calculate ").rstrip(".")
        numbers = expression.split()[::2]
        assert all(2 <= len(n) <= 3 for n in numbers) and len(numbers) == 3
        assert int(task.answer) == eval(expression)  # our own generated integers: Python's precedence is the reference


def test_bad_settings_are_named() -> None:
    problems = ArithmeticTasks(terms=1, min_digits=3, max_digits=2, operators=["/"]).config_problems()
    assert [p.split("=", 1)[0] for p in problems] == ["data.terms", "data.min_digits", "data.operators"]


def test_steps_are_the_value_after_each_operation_products_first() -> None:
    assert steps([14, 3, 25], ["+", "*"]) == [75, 89]
    assert steps([38, 673, 851], ["-", "+"]) == [-635, 216]
    assert steps([47, 77, 60, 80], ["*", "+", "*"]) == [3619, 4800, 8419]
    assert steps([12, 5], ["*"]) == [60]
    task = ArithmeticTasks(terms=4, train_size=20, seed=2).train_tasks()[7]
    assert len(task.metadata["steps"]) == 3 and task.metadata["steps"][-1] == task.answer
