"""An assistant's reply that restated a fact the user told it ranks behind the user's newer statement of another
value (recall's conflict check, ``agentmem.consolidate.local.echoes``), as the user's own older statement does.

A chat stores both sides of every exchange: "I take 20 mg of lisinopril every morning." and the reply "Got it, you
take 20 mg of lisinopril every morning." When the dose changes a session later, the user's older statement is
superseded or demoted, but the echo was another speaker's, so plain ``recall`` put it first: on the hand-written
held-out updates with such an echo (``benchmarks/knowledge_update.py --natural 4 --echoed``) the echo ranked above
the update for 0.71 of them. Only that way round: an assistant's later word never pushes the user's statement down.
"""

from __future__ import annotations

from pathlib import Path

from agentmem import AgentMemory

OLD, ECHO = "I take 20 mg of lisinopril every morning.", "Got it, you take 20 mg of lisinopril every morning."
NEW = "My doctor raised my lisinopril to 40 mg."
QUESTION = "How much lisinopril do I take?"
OTHERS = ["I like hiking on weekends.", "My favourite food is ramen.", "I need to buy coffee filters."]


def _told(mem: AgentMemory, later: list[dict[str, str]]) -> dict[str, str]:
    """OLD and its echo in session s1, other facts in s2, then the ``later`` messages in s3; their ids by text."""
    ids = {r.text: r.id for r in mem.remember_messages(
        [{"role": "user", "content": OLD}, {"role": "assistant", "content": ECHO}], user_id="u1", session_id="s1")}
    for text in OTHERS:
        mem.remember(text, user_id="u1", role="user", session_id="s2")
    ids |= {r.text: r.id for r in mem.remember_messages(later, user_id="u1", session_id="s3")}
    return ids


def test_the_users_update_ranks_before_the_assistants_echo_of_the_old_value(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        ids = _told(mem, [{"role": "user", "content": NEW}, {"role": "assistant", "content": "Thanks for telling me."}])
        ranked = [h.id for h in mem.recall(QUESTION, user_id="u1", k=5)]
        assert ids[NEW] in ranked and ids[ECHO] in ranked  # both recalled: the echo is not hidden
        assert ranked[0] == ids[NEW] and ranked.index(ids[ECHO]) > ranked.index(ids[NEW])
        assert mem.get(ids[ECHO], user_id="u1").status == "active"  # history is kept as said


def test_an_assistants_later_word_does_not_push_the_users_statement_down(tmp_path: Path) -> None:
    with AgentMemory(tmp_path / "s") as mem:
        ids = _told(mem, [{"role": "assistant", "content": "Your doctor raised your lisinopril to 40 mg."}])
        choice = mem.mount_choice(QUESTION, user_id="u1")
        assert ids[OLD] in [h.id for h in choice.mounted]  # the user's own statement is still what is mounted
        assert ids[OLD] not in [h.id for h in choice.contradicted]
