"""One mount policy (issue #39): what ``recall_for_mount`` leaves out is never mounted by ``generate``, and the
LangGraph memory node chooses by the same policy."""

from __future__ import annotations

import pytest

from agentmem import AgentMemory


def _seed(mem: AgentMemory) -> tuple[str, str]:
    said = mem.remember("Your parrot is called Polly.", user_id="u1", role="assistant", encode=False).id
    told = mem.remember("My parrot is called Kiwi.", user_id="u1", role="user", encode=False).id
    mem.remember("I cycle to work on Mondays.", user_id="u1", role="user", encode=False)
    return said, told


def test_assistant_turns_are_recalled_but_not_mountable(mem):
    said, told = _seed(mem)
    recalled = [h.id for h in mem.recall("What is my parrot called?", user_id="u1", k=5)]
    mountable = [h.id for h in mem.recall_for_mount("What is my parrot called?", user_id="u1", k=5)]
    assert said in recalled and told in recalled
    assert said not in mountable and told in mountable


@pytest.mark.parametrize("mem", [{"unmounted_roles": ()}], indirect=True)
def test_unmounted_roles_is_the_switch(mem):
    said, _ = _seed(mem)
    assert said in [h.id for h in mem.recall_for_mount("What is my parrot called?", user_id="u1", k=5)]


def test_mount_min_score_drops_weak_hits(mem_path):
    with AgentMemory(mem_path) as mem:
        _seed(mem)
        scores = {h.id: h.score for h in mem.recall("What is my parrot called?", user_id="u1", k=5)}
    cut = sorted(scores.values())[len(scores) // 2]  # a threshold between the hits' own scores
    with AgentMemory(mem_path, mount_min_score=cut) as mem:
        kept = {h.id for h in mem.recall_for_mount("What is my parrot called?", user_id="u1", k=5)}
        assert len(mem.recall("What is my parrot called?", user_id="u1", k=5)) == len(scores)  # recall unchanged
    below = {i for i, s in scores.items() if s < cut}
    assert kept and below and not kept & below


def test_memory_node_mounts_by_the_same_policy(mem):
    from agentmem_langgraph import MemoryNode
    from langchain_core.messages import HumanMessage

    said, told = _seed(mem)
    node = MemoryNode(mem, user_id="u1", mode="text", k=5)
    ids = [h.id for h in node.search({"messages": [HumanMessage("What is my parrot called?")]}, {})]
    assert told in ids and said not in ids


def test_mount_choice_says_which_hits_the_threshold_left_out(mem_path):
    with AgentMemory(mem_path) as mem:
        _seed(mem)
        scores = {h.id: h.score for h in mem.recall("What is my parrot called?", user_id="u1", k=5)}
    cut = sorted(scores.values())[len(scores) // 2]
    with AgentMemory(mem_path, mount_min_score=cut) as mem:
        choice = mem.mount_choice("What is my parrot called?", user_id="u1", k=5)
        assert [h.id for h in choice.mounted] == [
            h.id for h in mem.recall_for_mount("What is my parrot called?", user_id="u1", k=5)]
    assert choice.threshold == cut
    assert choice.below_threshold and all(h.score < cut for h in choice.below_threshold)
    assert {h.id for h in choice.below_threshold} == {i for i, s in scores.items() if s < cut}
    assert not {h.id for h in choice.mounted} & {h.id for h in choice.below_threshold}


JOB = ["I'm employed as a chef.", "I finished reading a thriller novel.", "I study Arabic in the evenings.",
       "I go to the gym on Mondays.", "I planted tomatoes on the balcony.", "I got promoted, I'm a teacher now."]


@pytest.mark.parametrize("threshold", [0.3, 0.5])
def test_a_mount_leaves_out_an_older_statement_a_newer_recalled_one_contradicts(tmp_path, threshold):
    # the write kept both jobs (the pair is below the supersede threshold), and recall's conflict check finds them
    # against the speaker's other hits: recall ranks the chef behind the teacher, a mount leaves the chef out (the
    # model never reads both). The teacher (~0.35) is mounted where it clears the threshold, and where it does not
    # (0.5) it takes the chef's place: leaving the chef out without it would mount no job at all
    with AgentMemory(tmp_path / "m", kv_encoding="off", mount_min_score=threshold) as mem:
        ids = {t: mem.remember(t, user_id="u1", role="user").id for t in JOB}
        assert mem.get(ids[JOB[0]]).status == "active"
        recalled = [h.id for h in mem.recall("What is my job?", user_id="u1", k=6)]
        assert recalled.index(ids[JOB[-1]]) < recalled.index(ids[JOB[0]])
        choice = mem.mount_choice("What is my job?", user_id="u1", k=4)
        mounted = [h.id for h in choice.mounted]
        assert ids[JOB[-1]] in mounted and ids[JOB[0]] not in mounted
        assert [h.id for h in choice.contradicted] == [ids[JOB[0]]]
        assert ids[JOB[0]] not in [h.id for h in choice.below_threshold]
        teacher = next(h for h in choice.mounted if h.id == ids[JOB[-1]])
        assert (teacher.score >= threshold) is (threshold == 0.3)  # at 0.5: mounted for the chef it replaces
        assert mounted == [h.id for h in mem.recall_for_mount("What is my job?", user_id="u1", k=4)]


def test_without_consolidation_nothing_is_contradicted(tmp_path):
    with AgentMemory(tmp_path / "m", kv_encoding="off", consolidation="off", mount_min_score=0.0) as mem:
        for t in JOB:
            mem.remember(t, user_id="u1", role="user")
        choice = mem.mount_choice("What is my job?", user_id="u1", k=6)
        assert choice.contradicted == [] and {"I'm employed as a chef.", JOB[-1]} <= {h.text for h in choice.mounted}
        assert all(h.contradicted_by is None for h in mem.recall("What is my job?", user_id="u1", k=6))


DOSE = [("user", "Hi, I'm Alice. I take 20 mg of lisinopril every morning."),
        ("assistant", "Thanks Alice, noted: 20 mg lisinopril each morning."),
        ("user", "I'm vegetarian and allergic to peanuts.")]


def test_recall_names_the_newer_memory_that_contradicts_a_hit(tmp_path):
    # the write keeps the older turn (it states two things: the name and the dose), recall ranks it behind the new
    # dose but returns it at its own score, so a caller filtering by min_score alone would read both doses as
    # answers; contradicted_by tells them apart (and a mount, which leaves it out, says the same)
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        old = [mem.remember(t, user_id="u1", role=r, session_id="s1") for r, t in DOSE]
        new = mem.remember("My doctor changed my lisinopril dose to 40 mg.", user_id="u1", role="user",
                           session_id="s2")
        assert new.event == "ADD" and mem.get(old[0].id).status == "active"
        hits = mem.recall("What dose of lisinopril do I take?", user_id="u1", k=5, min_score=0.5)
        by_id = {h.id: h for h in hits}
        assert hits[0].id == new.id and hits[0].contradicted_by is None
        assert old[0].id in by_id and by_id[old[0].id].score >= 0.5  # still a match for the question
        assert by_id[old[0].id].contradicted_by == new.id and by_id[old[1].id].contradicted_by == new.id
        assert [h.id for h in hits if h.contradicted_by is None] == [new.id]
        assert by_id.get(old[2].id) is None or by_id[old[2].id].contradicted_by is None
        choice = mem.mount_choice("What dose of lisinopril do I take?", user_id="u1")
        assert [(h.id, h.contradicted_by) for h in choice.contradicted] == [(old[0].id, new.id)]
        assert [h.id for h in choice.mounted] == [new.id]


def test_two_facts_of_the_same_shape_are_not_a_changed_value(tmp_path):
    # "I'm allergic to penicillin." / "I'm vegan since 2019.": the same two words, then another fact; taken for one
    # value swapped, the allergy was left out of the mount for "Do I have any allergies?" and the diet mounted in
    # its place. A real swap names what changed ("my PIN is ...") and still replaces the older.
    facts = ["I'm allergic to penicillin.", "I play tennis every Sunday.", "I drive a blue Toyota Corolla.",
             "I'm vegan since 2019."]
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        allergy, *_ = [mem.remember(t, user_id="u1", role="user") for t in facts]
        assert [h.id for h in mem.recall_for_mount("Do I have any allergies?", user_id="u1")] == [allergy.id]
        hits = mem.recall("Do I have any allergies?", user_id="u1", k=4)
        assert hits[0].id == allergy.id and all(h.contradicted_by is None for h in hits)
        old = mem.remember("My bank PIN is 4821.", user_id="u1", role="user")
        new = mem.remember("My bank PIN is 7730.", user_id="u1", role="user")
        assert [h.id for h in mem.recall_for_mount("What is my bank PIN?", user_id="u1")] == [new.id]
        assert new.superseded_ids == (old.id,)  # (the write already settles this one)


@pytest.mark.parametrize("older, newer, question", [
    ("I speak French.", "I also speak German.", "Which languages do I speak?"),
    ("I have a sister called Anna.", "I also have a sister called Mia.", "What are my sisters called?"),
])
def test_a_statement_that_says_it_adds_replaces_nothing(tmp_path, older, newer, question):
    # before, the write superseded the French and Anna ("also" or not, the pairs read alike, as every change the
    # pairwise model was fitted on does), so recall and a mount held only the newer
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        for t in ["I drive a blue Toyota Corolla.", "I planted tomatoes on the balcony.", "The weather was lovely."]:
            mem.remember(t, user_id="u1", role="user")
        first = mem.remember(older, user_id="u1", role="user", session_id="s1")
        second = mem.remember(newer, user_id="u1", role="user", session_id="s2")
        assert second.event == "ADD" and mem.get(first.id).status == "active"
        assert {h.id for h in mem.recall_for_mount(question, user_id="u1")} == {first.id, second.id}
        assert all(h.contradicted_by is None for h in mem.recall(question, user_id="u1", k=3))


FILLERS = ["I drive a blue Toyota Corolla.", "I planted tomatoes on the balcony.", "The weather was lovely.",
           "I need to buy coffee filters."]


# a newer statement that changes none of the user's facts: before, the pairwise model read each as an update, so the
# write hid the older statement (a dose, a city), or recall demoted it and a mount left it out
NO_CHANGE = [
    # about someone else (consolidate/subjects.py)
    ("I work as a teacher.", "My mother was a data analyst.", "What do I do for a living?"),
    ("My mother was an architect.", "I work as a nurse.", "What was my mother's job?"),
    ("I commute by tram.", "My partner commutes by ferry.", "How do I commute?"),
    ("My brother works as a lawyer.", "I work as an electrician.", "What does my brother do?"),
    # a plan or possibility (statements.speaks_of_a_possibility)
    ("I live in Paris.", "I'm thinking about moving to Berlin.", "Where do I live?"),
    ("I take 20 mg of lisinopril.", "My doctor may raise my lisinopril to 40 mg.", "How much lisinopril do I take?"),
    ("I live in Lyon.", "We might move to Marseille next year.", "Where do I live?"),
    # an exception limited to an occasion, and the rule (statements.narrows_to_an_occasion)
    ("I work from the office.", "On Fridays I work from home.", "Where do I work from?"),
    ("I commute by bus.", "On weekends I get around by ferry.", "How do I commute?"),
    ("On weekends I get around by bike.", "I commute by train now.", "How do I get around on weekends?"),
]


@pytest.mark.parametrize("older, newer, question", NO_CHANGE)
def test_a_newer_statement_that_changes_no_fact_leaves_the_older_standing(tmp_path, older, newer, question):
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        for t in FILLERS:
            mem.remember(t, user_id="u1", role="user")
        first = mem.remember(older, user_id="u1", role="user", session_id="s1")
        second = mem.remember(newer, user_id="u1", role="user", session_id="s2")
        assert second.event == "ADD" and mem.get(first.id).status == "active"
        assert first.id in {h.id for h in mem.recall_for_mount(question, user_id="u1")}
        assert [h.contradicted_by for h in mem.recall(question, user_id="u1", k=5) if h.id == first.id] == [None]


def test_a_question_about_the_user_is_answered_by_the_user_s_statement_first(tmp_path):
    # the relative's statement shares more words with the question ("favorite food"); before, it also read as the
    # newer value of the user's favorite food and was put first
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        for t in FILLERS:
            mem.remember(t, user_id="u1", role="user")
        mine = mem.remember("Nothing beats ramen for me.", user_id="u1", role="user", session_id="s1")
        mem.remember("My husband's favorite food is lasagna.", user_id="u1", role="user", session_id="s2")
        assert mem.recall("What is my favorite food?", user_id="u1", k=3)[0].id == mine.id
        assert mem.recall("What is my husband's favorite food?", user_id="u1", k=3)[0].text.startswith("My husband")


def test_a_relative_s_own_update_still_replaces_theirs(tmp_path):
    with AgentMemory(tmp_path / "m", kv_encoding="off") as mem:
        for t in FILLERS:
            mem.remember(t, user_id="u1", role="user")
        first = mem.remember("My sister lives in Berlin.", user_id="u1", role="user", session_id="s1")
        second = mem.remember("My sister moved to Madrid.", user_id="u1", role="user", session_id="s2")
        hits = mem.recall("Where does my sister live?", user_id="u1", k=3)
        assert hits[0].id == second.id
        assert first.id not in {h.id for h in mem.recall_for_mount("Where does my sister live?", user_id="u1")}


def test_a_memory_longer_than_the_mount_budget_does_not_keep_the_others_out(tmp_path):
    """A long tool result ranked first is dropped for the budget; the short memories after it are still mounted."""
    from agentmem.kv.testing import tiny_causal_lm

    page = "Restaurants in Ghent, a guide: " + " ".join(
        f"Restaurant {i} in Ghent serves Flemish stew and waffles near the Graslei." for i in range(12))
    with AgentMemory(tmp_path / "s", model=tiny_causal_lm("llama"), mount_budget_tokens=300,
                     mount_min_score=0.0) as mem:
        long = mem.remember(page, user_id="u1", kind="tool", speaker="web_search")
        diet = mem.remember("I am vegetarian.", user_id="u1", role="user")
        hits = mem.recall_for_mount("Which restaurant in Ghent serves Flemish stew?", user_id="u1", k=4)
        assert [h.id for h in hits] == [long.id, diet.id] and mem.count_tokens(page) > 300
        out = mem.generate("Which restaurant in Ghent serves Flemish stew?", user_id="u1", k=4, max_new_tokens=2)
    assert out.mounted == [diet.id] and out.dropped == [long.id]
    assert any("did not fit" in n for n in out.notes)
