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


def test_a_range_of_terms_gives_every_length_in_equal_shares_each_saying_its_length() -> None:
    data = ArithmeticTasks(terms=[2, 4], train_size=300, eval_size=30, seed=1)
    train = data.train_tasks()
    counts = [len(t.question.removeprefix("Calculate ").rstrip(".").split()[::2]) for t in train]
    assert counts[:6] == [2, 3, 4, 2, 3, 4] and {n: counts.count(n) for n in (2, 3, 4)} == {2: 100, 3: 100, 4: 100}
    for task, terms in zip(train, counts):
        assert task.metadata["operations"] == terms - 1 == len(task.metadata["steps"])
        assert task.metadata["eval_group"] == f"terms_{terms}"
        assert int(task.answer) == eval(task.question.removeprefix("Calculate ").rstrip("."))
    assert [t.metadata["operations"] for t in data.eval_tasks()[:6]] == [1, 2, 3, 1, 2, 3]


def test_the_held_out_split_has_lengths_of_its_own_in_turn_and_never_a_train_question() -> None:
    data = ArithmeticTasks(terms=[2, 3], eval_terms=[3, 5], train_size=200, eval_size=31, seed=0)
    held_out = data.eval_tasks()
    assert len(held_out) == 31 and not {t.question for t in held_out} & {t.question for t in data.train_tasks()}
    groups = [t.metadata["eval_group"] for t in held_out]
    assert groups[:3] == ["terms_3", "terms_4", "terms_5"]
    assert {g: groups.count(g) for g in set(groups)} == {"terms_3": 11, "terms_4": 10, "terms_5": 10}
    assert {t.metadata["operations"] for t in data.train_tasks()} == {1, 2}  # five terms never trained on
    assert ArithmeticTasks(terms=3, eval_terms=5, eval_size=4).eval_tasks()[0].metadata["operations"] == 4


def test_one_length_gives_the_tasks_it_always_gave() -> None:
    # The questions the generator gave before lengths could be mixed: a single length draws exactly as it did.
    first = ArithmeticTasks(terms=3, train_size=2, eval_size=1, seed=0)
    assert [t.question for t in first.train_tasks()] == ["Calculate 876 - 141 - 623.", "Calculate 588 + 697 - 74."]
    assert first.eval_tasks()[0].uid == "arithmetic/eval/1000003/0"


def test_a_range_must_be_low_to_high_from_two() -> None:
    assert ArithmeticTasks(terms=[2, 4], eval_terms=5).config_problems() == []
    problems = ArithmeticTasks(terms=[4, 2], eval_terms=[1, 3]).config_problems()
    assert [p.split("=", 1)[0] for p in problems] == ["data.terms", "data.eval_terms"]
    assert [p.split("=", 1)[0] for p in ArithmeticTasks(terms=[2, 3, 4]).config_problems()] == ["data.terms"]
