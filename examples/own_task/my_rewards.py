"""Example reward functions for grpo_pipe, outside the package (TRL's reward-function signature).

Each gets one list entry per completion: `completions` (texts), `prompts`, `answers`, and every extra
column of the data file as a keyword argument (here `kind` and `level`).
"""


def final_answer(text):
    """What follows the last `####` on its line (the system prompt asks for it), else None."""
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()


def score(completions, answers, kind, level, **kwargs):
    """1 for a right answer (numbers compared as numbers, words case-insensitively), harder tasks worth
    a little more; None (counted as reward.none_value) when the reply has no marked answer."""
    rewards = []
    for text, answer, task_kind, task_level in zip(completions, answers, kind, level):
        given = final_answer(text)
        if given is None:
            rewards.append(None)
        elif task_kind == "number":
            rewards.append(float(given.replace(",", "") == answer) * (1.0 + 0.1 * (task_level - 1)))
        else:
            rewards.append(float(given.lower() == answer.lower()) * (1.0 + 0.1 * (task_level - 1)))
    return rewards


def brevity(completions, **kwargs):
    """A small push towards short replies: 1 for an empty reply, 0 at 200 characters and beyond."""
    return [max(0.0, 1.0 - len(text) / 200) for text in completions]
