import pytest

from traceless.engine.request import InvalidTransition, Request, RequestStatus
from traceless.sampling_params import SamplingParams


def test_repr_shows_counts_never_tokens():
    r = Request("r1", [91234, 55555, 42], SamplingParams(), frozenset())
    r.append_output(77777)
    text = repr(r) + str(r)
    for token in ("91234", "55555", "77777"):
        assert token not in text
    assert "prompt_tokens=3" in text and "output_tokens=1" in text


def test_token_views_span_prompt_and_output():
    r = Request("r", [1, 2, 3], SamplingParams(), frozenset())
    r.append_output(4)
    r.append_output(5)
    assert r.token_ids(0, 5) == [1, 2, 3, 4, 5]
    assert r.token_ids(2, 4) == [3, 4] and r.token_ids(3, 5) == [4, 5] and r.token_ids(0, 2) == [1, 2]
    assert r.num_tokens == 5 and r.last_token_id == 5


def test_transitions_are_explicit():
    r = Request("r", [1], SamplingParams(), frozenset())
    with pytest.raises(InvalidTransition):
        r.transition(RequestStatus.PREEMPTED)  # waiting -> preempted is not a thing
    r.transition(RequestStatus.RUNNING)
    r.transition(RequestStatus.FINISHED_ABORTED)
    assert r.status.finished and r.status.finish_reason == "abort"
    with pytest.raises(InvalidTransition):
        r.transition(RequestStatus.RUNNING)


def test_wipe_overwrites_and_drops_tokens():
    prompt = [9, 8, 7]
    r = Request("r", prompt, SamplingParams(), frozenset())
    r.append_output(6)
    inner = r._prompt
    r.wipe()
    assert r.num_tokens == 0 and inner == [] and prompt == [9, 8, 7]  # the caller's list is not touched
