from grpo_pipe.data.reasoning_gym import ReasoningGymTasks

DIFFICULTY = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2, operators=["+", "-"],
                  allow_negation=False, allow_parentheses=False)


def test_splits_are_deterministic_and_disjoint() -> None:
    a = ReasoningGymTasks(train_size=300, eval_size=50, seed=3, difficulty=DIFFICULTY)
    b = ReasoningGymTasks(train_size=300, eval_size=50, seed=3, difficulty=DIFFICULTY)
    assert a.train_tasks() == b.train_tasks() and a.eval_tasks() == b.eval_tasks()
    assert len(a.eval_tasks()) == 50
    assert not {t.question for t in a.train_tasks()} & {t.question for t in a.eval_tasks()}
    assert all(t.question.startswith("Calculate") for t in a.train_tasks())
    assert ReasoningGymTasks(seed=4, train_size=300, difficulty=DIFFICULTY).train_tasks() != a.train_tasks()
