"""Profile memories (kind "profile": standing facts, preferences, constraints) are mounted with every answer, whatever
the question and their score, under the request's own kinds; the k recalled memories come besides them."""

from __future__ import annotations

import pytest

from agentmem import AgentMemory
from agentmem.kv.testing import tiny_causal_lm

FRIDAYS = "Never schedule meetings for me on Fridays."
MANAGER = "My manager is called Dana Whitfield."
QUESTION = "Draft an email to my boss about the delay."  # scores MANAGER as unrelated (docs/recall.md)


def test_a_constraint_the_request_does_not_restate_is_mounted_as_profile(mem: AgentMemory):
    mem.remember("My dog is called Rex.", user_id="u1")
    as_turn = mem.remember(MANAGER, user_id="u2")
    # kept as an ordinary memory it scores as unrelated to the request, so no mount holds it
    choice = mem.mount_choice(QUESTION, user_id="u2")
    assert as_turn.id not in [h.id for h in choice.mounted]
    profile = mem.remember(MANAGER, user_id="u1", kind="profile")
    choice = mem.mount_choice(QUESTION, user_id="u1")
    assert [h.id for h in choice.mounted][:1] == [profile.id] and choice.mounted[0].score < choice.threshold
    assert [h.text for h in mem.recall_for_mount("What is my dog called?", user_id="u1")] == [
        MANAGER, "My dog is called Rex."]  # the profile first, the recalled ones after it


def test_the_request_kinds_and_the_switch_apply(mem_path):
    with AgentMemory(mem_path) as mem:
        profile = mem.remember(MANAGER, user_id="u1", kind="profile")
        mem.remember("My dog is called Rex.", user_id="u1")
        assert profile.id not in [h.id for h in mem.recall_for_mount(QUESTION, user_id="u1", kinds=["turn"])]
        assert profile.id in [h.id for h in mem.recall_for_mount(QUESTION, user_id="u1", kinds=["profile"])]
    with AgentMemory(mem_path, mount_profile_max=0) as mem:  # off: mounted only when recalled like any memory
        assert profile.id not in [h.id for h in mem.recall_for_mount(QUESTION, user_id="u1")]
        assert profile.id in [h.id for h in mem.recall_for_mount("What is my manager's name?", user_id="u1")]


@pytest.mark.parametrize("mem", [{"mount_profile_max": 2}], indirect=True)
def test_at_most_mount_profile_max_the_most_relevant_and_never_an_older_changed_one(mem: AgentMemory):
    metric = mem.remember("I prefer metric units.", user_id="u1", kind="profile")
    imperial = mem.remember("I prefer imperial units now.", user_id="u1", kind="profile")
    cats = mem.remember("I am allergic to cats.", user_id="u1", kind="profile")
    mem.remember(FRIDAYS, user_id="u1", kind="profile")
    mounted = [h.id for h in mem.recall_for_mount("Should I adopt a kitten?", user_id="u1")]
    assert len(mounted) == 2 and mounted[0] == cats.id
    distance = [h.id for h in mem.recall_for_mount("How far is Paris from Berlin?", user_id="u1")]
    assert imperial.id in distance and metric.id not in distance  # the newer preference, never both values


def test_generate_and_a_session_mount_the_profile(tmp_path):
    with AgentMemory(tmp_path / "s", model=tiny_causal_lm("llama")) as mem:
        profile = mem.remember(MANAGER, user_id="u1", kind="profile")
        assert mem.generate(QUESTION, user_id="u1", max_new_tokens=2).mounted == [profile.id]
        reply = mem.session("s1", user_id="u1").send(QUESTION, max_new_tokens=2)
        assert profile.id in reply.mounted
