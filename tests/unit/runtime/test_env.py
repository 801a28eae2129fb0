"""The engine process's GPUs: `rollout.layout.device_ids` counts among the cards this process sees."""

from __future__ import annotations

import os

import pytest

from grpo_pipe.runtime import env


@pytest.mark.parametrize(("device_ids", "visible", "child"), [
    ("1", None, "1"),                       # nothing narrowed: the ids are the machine's
    ("1", "", "1"),
    ("1", "2,3", "3"),                      # the second card this job was given, not physical 1
    ("1", "1,0", "0"),                      # reordered: id 1 is physical 0, not the trainer's card
    ("0,1", "4, 6", "4,6"),
    ("0", "GPU-aaaa,GPU-bbbb", "GPU-aaaa"),  # UUIDs pass through as listed
])
def test_device_ids_become_entries_of_the_parents_visible_list(device_ids: str, visible: str | None,
                                                              child: str) -> None:
    assert env.among_visible(device_ids, visible) == child


@pytest.mark.parametrize(("device_ids", "named"), [("2", "indices 0..1"), ("a", "GPU indices"), ("-1", "GPU indices")])
def test_an_id_that_names_no_visible_card_is_refused_naming_the_setting(device_ids: str, named: str) -> None:
    with pytest.raises(ValueError, match="rollout.layout.device_ids") as refused:
        env.among_visible(device_ids, "0,1")
    assert named in str(refused.value)


def test_the_engines_block_sees_its_card_among_the_parents_and_restores_the_parents_list(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    with env.visible_devices("1"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,0"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with env.visible_devices("1"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
