"""Whom a one-sentence statement is about: the speaker, or someone the speaker names by their relation.

"My mother was a data analyst." says nothing about the speaker's job, yet it reads like "I work as a teacher." to
the pairwise supersession model, which has no notion of a subject: every change it was fitted on has the speaker
as subject, so a relative's statement of the same kind scored as an update, hid the user's own statement on write
(`benchmarks/knowledge_update.py`'s held-out look-alikes: 6 of the 12 it hid) and pushed it out of a mount at
recall. :func:`about_someone_else` tells two statements whose subjects differ, and then neither replaces the other.

Only what the first words say is read, and only where they say it plainly. A sentence whose first person word,
among its first four (after an opener such as "Oh," or "Actually"), is "I" is the speaker's ("Every morning I
take the train."), and so is one whose first is "my" followed by a thing ("My phone is a Moto G."). "My" followed
by a relation ("my mother", "my older brother's") is that relative's, unless the sentence goes on to the speaker's
own things ("My husband moved my appointment to Friday." is the speaker's appointment) or joins the speaker in
("My wife and I moved to Berlin."), or names who holds the relation ("My girlfriend's name is Julia.", "My
partner is Sofia.": who the speaker's partner is, the speaker's fact, which "I broke up and now I'm seeing Nina."
changes). Any other sentence ("Anna moved to Madrid.", "We transferred my daughter to Oakwood.", "She quit.") or
a text of several sentences is read as unknown, and an unknown subject differs from none: the rule only keeps
apart what it is sure of. Relations that act on the speaker's affairs (doctor, manager, coach) are not in the list:
"My doctor raised my dose to 40 mg." is an update of the speaker's dose.

Example:
    >>> subject_of("I work as a teacher."), subject_of("My mother was a data analyst.")
    ('i', 'mother')
    >>> subject_of("My phone is a Moto G."), subject_of("My husband's favorite food is lasagna.")
    ('i', 'husband')
    >>> subject_of("My wife and I moved to Berlin."), subject_of("My husband moved my appointment to Friday.")
    (None, None)
    >>> about_someone_else("I work as a teacher.", "My mom was a data analyst.")
    True
    >>> about_someone_else("My sister lives in Berlin.", "Anna moved to Madrid.")
    False
"""

from __future__ import annotations

from collections.abc import Sequence

from agentmem.consolidate.statements import sentence_count, statement_tokens

SPEAKER = "i"
# openers a sentence may start with before its subject
_OPENERS = frozenset({"oh", "ah", "well", "so", "actually", "also", "and", "but", "btw", "now", "yeah", "yes", "no",
                      "ok", "okay", "hey", "hi", "anyway", "honestly", "fyi", "just", "plus", "um", "hmm"})
# relations by which a speaker names another person, each mapped to one spelling (mum and mom are one mother)
_RELATIONS = {
    **dict.fromkeys(("mother", "mom", "mum", "mommy", "mummy", "mama", "ma"), "mother"),
    **dict.fromkeys(("father", "dad", "daddy", "papa", "pa"), "father"),
    **dict.fromkeys(("parents", "parent"), "parents"),
    **dict.fromkeys(("kids", "kid", "children", "child"), "children"),
    **dict.fromkeys(("grandma", "grandmother", "granny", "nan", "nana"), "grandmother"),
    **dict.fromkeys(("grandpa", "grandfather", "granddad", "grandad"), "grandfather"),
    **dict.fromkeys(("neighbour", "neighbor", "neighbours", "neighbors"), "neighbour"),
    **dict.fromkeys(("colleague", "coworker", "co-worker", "colleagues", "coworkers"), "colleague"),
    **{word: word for word in ("brother", "sister", "son", "daughter", "husband", "wife", "partner", "spouse",
                               "boyfriend", "girlfriend", "fiance", "fiancee", "friend", "roommate", "flatmate",
                               "housemate", "aunt", "uncle", "cousin", "nephew", "niece", "grandparents",
                               "siblings", "sibling", "stepmother", "stepfather", "stepson", "stepdaughter")},
}
_COPULAS = frozenset({"is", "was", "are", "were", "s"})
_FIRST_PERSON = frozenset({"i", "me", "my", "mine", "myself", "we", "us", "our", "ours"})
_PERSONS = frozenset({"i", "me", "my", "we", "us", "our", "you", "your", "he", "him", "his", "she", "her", "they",
                      "them", "their", "it", "its"})
_LEAD = 4  # a subject comes within a sentence's first words, after an adverbial at most ("On weekends I ...")
# the words that may stand between "my" and a relation: "my older brother", "my best friend"; any other makes a
# compound that names a role in the speaker's own affairs ("my tennis partner moved away": the speaker's tennis)
_KIN_MODIFIERS = frozenset({"older", "younger", "elder", "eldest", "oldest", "youngest", "little", "big", "baby",
                            "twin", "best", "late", "ex", "new", "step", "half", "grown", "adult", "two", "three"})


def subject_of(text: str) -> str | None:
    """Whom a one-sentence ``text`` is about, when its first words say so plainly: ``"i"`` (the speaker), a
    relation ("mother", "brother", ...), or None (unknown, or a text of several sentences).

    >>> subject_of("Oh, my older brother works as a lawyer."), subject_of("On weekends I get around by tram.")
    ('brother', 'i')
    >>> subject_of("Please use my husband Raj as my emergency contact."), subject_of("She quit her job.")
    (None, None)
    >>> subject_of("My tennis partner moved away, so no more Saturday tennis.")
    'i'
    """
    if sentence_count(text) != 1:
        return None
    tokens = statement_tokens(text)
    opened = 0
    while opened < len(tokens) and tokens[opened] in _OPENERS:
        opened += 1
    # the first person word of the sentence's first few ("Every morning I ...", "The vet put my cat ...")
    start = next((n for n in range(opened, min(opened + _LEAD, len(tokens))) if tokens[n] in _PERSONS), None)
    if start is None or tokens[start] not in ("i", "my"):
        return None
    if tokens[start] == "i":
        return SPEAKER
    n = start + 1
    while n < len(tokens) and tokens[n] in _KIN_MODIFIERS:  # "my older brother", "my best friend"
        n += 1
    relation = _RELATIONS.get(tokens[n]) if n < len(tokens) else None
    if relation is None:
        return SPEAKER  # "my phone", "my tennis partner": the speaker's (a partner in the speaker's game)
    if _names_who(tokens[n + 1:n + 3], text):
        return SPEAKER  # "My girlfriend's name is Julia.": who the speaker's girlfriend is, the speaker's fact
    # the speaker's own things or the speaker joined in: about the speaker too
    return None if _FIRST_PERSON & set(tokens[n + 1:]) else relation


def _names_who(after: Sequence[str], text: str) -> bool:
    """Whether the words ``after`` a relation name who holds it: "'s name", "is called", or "is" and a capitalised
    name ("My partner is Sofia." against "My mother was a lawyer.")."""
    if tuple(after[:2]) == ("s", "name") or (after[:1] and after[0] in ("called", "named")):
        return True
    if len(after) < 2 or after[0] not in _COPULAS:
        return False
    if after[1] in ("called", "named"):
        return True
    return any(word[:1].isupper() for word in text.split() if word.strip(".,!?;:").casefold() == after[1])


def about_someone_else(older: str, newer: str) -> bool:
    """True when the two texts are surely about different people (:func:`subject_of` of both known and unequal):
    then neither states a newer value of the other's fact.

    >>> about_someone_else("I commute by bike.", "My colleague comes in by scooter.")
    True
    >>> about_someone_else("My brother lives with me.", "My brother got his own apartment.")
    False
    """
    return differ(subject_of(older), subject_of(newer))


def differ(a: str | None, b: str | None) -> bool:
    """Whether two :func:`subject_of` results are surely different people (neither unknown, not equal)."""
    return a is not None and b is not None and a != b


__all__ = ["SPEAKER", "about_someone_else", "differ", "subject_of"]
