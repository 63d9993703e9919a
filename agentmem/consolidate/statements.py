"""When are two statements the same statement? Surface comparisons for consolidation (issue #37).

* :func:`statement_key` — the text with case, spacing and punctuation normalised away, and nothing else: two writes
  merge (``NOOP``) only when their keys are equal. Punctuation that is part of a value stays: the sign, decimal
  point or separator inside a number (``-5``, ``5.5``, ``4,821``, ``12:30``) and symbols such as ``$``, ``€``,
  ``%`` or ``#``, so "It costs 5.5 EUR." and "It costs 55 EUR." are two statements.
* :func:`changed_span` / :func:`changed_value` — the two texts say the same thing with a value swapped ("I take 5
  mg" / "I take 10 mg", "note number 3" / "note number 4"): they share the frame and differ in one short run of
  words. Such a pair is two memories (never merged); recall puts the newer first when both are found.
* :func:`sentence_count` — how many sentences a text has: only a one-sentence memory can be superseded (a newer
  statement replaces one fact; hiding a longer memory would hide the others it states).
* :func:`says_it_adds` — the text says it adds to what was said ("I also speak German."): it replaces no fact.
* :func:`speaks_of_a_possibility` — every sentence of it is a plan, wish or possibility ("I'm thinking about moving
  to Berlin."): nothing has changed yet, so it replaces no fact either (:func:`replaces_no_fact`: one or the other).
* :func:`narrows_to_an_occasion` — one text is limited to an occasion the other does not name ("On weekends I get
  around by ferry." and "I commute by bus."): an exception and the rule, neither a change of the other.
* :func:`only_asks` — the text asks and states nothing ("Where do I live?", "Hey! Is it still 5 mg?"): it replaces
  no fact, so it supersedes and demotes nothing (a user who asks about a fact would otherwise retract it).

Example:
    >>> statement_key("I live in  Lyon!") == statement_key("i live in lyon")
    True
    >>> statement_key("It costs 5.5 EUR.") == statement_key("It costs 55 EUR.")
    False
    >>> changed_value("I take 5 mg of amlodipine daily.", "I take 10 mg of amlodipine daily.")
    True
    >>> changed_value("I live in Lyon.", "We watched a film about whales.")
    False
    >>> sentence_count("My cat, Fluffy, keeps me company. Haha!"), sentence_count("It costs 5.5 EUR.")
    (2, 1)
    >>> only_asks("Do I still live in Lyon?"), only_asks("Is it 5 mg? No, it is 10 mg now.")
    (True, False)
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Sequence
from typing import NamedTuple

from agentmem.text import content_words, sentences

# a number with its sign and inner separators ("-5", "5.5", "4,821", "12:30", "2026-03-04"), a word, or any other
# single non-space character (punctuation is dropped below, symbols are kept)
_TOKEN = re.compile(r"(?<![\w.,:/-])[-+−]?\d+(?:[.,:/-]\d+)*|\w+|[^\w\s]")
# punctuation that carries a value: kept as a token of its own
_VALUE_PUNCTUATION = frozenset("%#@&*/\\‰°")
MAX_CHANGED = 3  # a value swap replaces at most this many tokens ("5 mg" -> "10 mg": 1; "May 3, 2026" -> ...: 3)
MIN_SHARED = 2  # ... and keeps at least this many tokens of the frame


def _is_punctuation(token: str) -> bool:
    return len(token) == 1 and unicodedata.category(token).startswith("P") and token not in _VALUE_PUNCTUATION


def statement_tokens(text: str) -> tuple[str, ...]:
    """The text's tokens after Unicode compatibility folding and case folding, sentence punctuation dropped.

    >>> statement_tokens("The PIN is 4,821 (not $40)!")
    ('the', 'pin', 'is', '4,821', 'not', '$', '40')
    """
    folded = unicodedata.normalize("NFKC", text).casefold()
    return tuple(t for t in _TOKEN.findall(folded) if not _is_punctuation(t))


def statement_key(text: str) -> str:
    """The text normalised for case, spacing and punctuation only: equal keys are the same statement."""
    return " ".join(statement_tokens(text))


def changed_span(older: Sequence[str], newer: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Where ``newer``'s tokens restate ``older``'s with a value swapped: the one replaced run of tokens (older's,
    newer's), when it is the only difference, at most ``MAX_CHANGED`` tokens on each side, at least ``MIN_SHARED``
    tokens of the frame are shared, and the frame names what the value is of (a content word of two letters or
    more: "pin", "live", "meeting"); else None (the same statement, a mere insertion, or another one). A frame of
    function words only ("I'm ...") names nothing: "I'm allergic to penicillin." / "I'm vegan since 2019." are two
    facts, and taking them for one value swapped left the allergy out of the mount for "Do I have any allergies?".

    >>> changed_span(("my", "pin", "is", "4821"), ("my", "pin", "is", "4822"))
    (('4821',), ('4822',))
    >>> changed_span(("that", "s", "great"), ("that", "s", "so", "great")) is None
    True
    >>> changed_span(("i", "m", "allergic", "to", "penicillin"), ("i", "m", "vegan", "since", "2019")) is None
    True
    """
    if tuple(older) == tuple(newer) or len(set(older) ^ set(newer)) > 2 * MAX_CHANGED:
        return None  # the same, or too different to be one swap (a cheap test before aligning them)
    ops = [op for op in difflib.SequenceMatcher(a=older, b=newer, autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) != 1 or ops[0][0] != "replace":
        return None
    _, i1, i2, j1, j2 = ops[0]
    if max(i2 - i1, j2 - j1) > MAX_CHANGED or len(older) - (i2 - i1) < MIN_SHARED:
        return None
    frame = " ".join((*older[:i1], *older[i2:]))
    if not any(len(word) > 1 for word in content_words(frame)):
        return None  # the frame names nothing the value could be of
    return tuple(older[i1:i2]), tuple(newer[j1:j2])


def sentence_count(text: str) -> int:
    """How many sentences ``text`` has (0 for a blank text; :func:`agentmem.text.sentences`). "5.5" and "v1.2" have
    no space after the point; an abbreviation ("Dr. Smith") counts as an end, which errs on the side of keeping a
    memory (only a one-sentence memory can be superseded).

    >>> sentence_count("Hey! How are you? I moved to Lyon."), sentence_count("I live in Lyon")
    (3, 1)
    """
    return len(sentences(text))


def stated_sentences(text: str) -> list[str]:
    """The sentences of ``text`` that state something: not a question, more than two words ("Hi!", "Thanks a lot."
    state nothing a newer memory could change).

    >>> stated_sentences("Hi! I'm Dana. I take 20 mg of lisinopril. Is that a lot?")
    ['I take 20 mg of lisinopril.']
    """
    return [s for s in sentences(text) if not s.endswith(("?", "\uff1f")) and len(s.split()) > 2]


def only_asks(text: str) -> bool:
    """True when ``text`` asks and states nothing: each of its sentences is a question (it ends with a question
    mark) or at most two words ("Hi!", "Thanks."), and one at least is a question.

    >>> only_asks("Hey! Where do I live now?"), only_asks("I live in Lyon."), only_asks("Thanks!")
    (True, False, False)
    """
    said = sentences(text)
    asks = [s.endswith(("?", "\uff1f")) for s in said]
    return any(asks) and all(a or len(s.split()) <= 2 for a, s in zip(asks, said))


# words that say a statement adds to what was said ("I also speak German.", "..., peanuts as well."): "too" and
# "as well" only at the end of a clause ("too expensive" is a degree, not an addition)
_ADDS = re.compile(r"\b(?:also|in addition)\b|\b(?:too|as well)\s*(?:[.!,;:)]|$)", re.IGNORECASE)


def says_it_adds(text: str) -> bool:
    """True when ``text`` says it adds to what was said ("also", "in addition", a clause ending in "too" / "as
    well"): "I also speak German." after "I speak French." is a second language, not a changed one, so it replaces
    nothing. (Before, the pairwise model superseded the French on write: the two statements are alike, and every
    change it was fitted on reads alike too.)

    >>> says_it_adds("I also speak German."), says_it_adds("I'm allergic to peanuts as well.")
    (True, True)
    >>> says_it_adds("I quit violin lessons, too expensive."), says_it_adds("I speak German now.")
    (False, False)
    """
    return _ADDS.search(text) is not None


# words that make a sentence a plan, wish or possibility: nothing has changed yet ("I'm thinking about moving to
# Berlin.", "My doctor may raise my dose."). Lower-case "may" only: "May" is also the month. Not "will" / "going
# to" (a rescheduled appointment "will be on the 14th" is changed) nor "could" ("I could eat ramen every day.")
_POSSIBLE = re.compile(r"\b(?:might|maybe|perhaps|someday|one day|(?:thinking|dreaming) (?:about|of)|considering|"
                       r"plan(?:ning)? (?:to|on)|plans to|wants? to|wanna|hop(?:e|ing) to|would (?:like|love) to|"
                       r"(?:I|we|you|he|she|they)'d (?:like|love) to|dream(?:s)? of)\b", re.IGNORECASE)
_MAY = re.compile(r"\bmay\b")
# ... unless the sentence says the plan itself changed: "I don't want to learn Spanish anymore."
_REVISED = re.compile(r"\b(?:anymore|any more|no longer|instead|changed my mind)\b", re.IGNORECASE)


def speaks_of_a_possibility(text: str) -> bool:
    """True when every sentence ``text`` states speaks of a plan, wish or possibility ("might", "may", "maybe",
    "thinking about", "planning to", "want to", "would like to", "someday", ...): "I'm thinking about moving to
    Berlin." after "I live in Paris." changes nothing yet, and the pairwise model read it as the move (a mount for
    "Where do I live?" left Paris out; "My doctor may raise my lisinopril to 40 mg." superseded the current dose).
    A message with one plain statement besides ("I moved to Berlin. Maybe I'll move again.") is not one, nor a
    sentence that revises the plan ("I don't want to learn Spanish anymore.", "I want to study French instead.").

    >>> speaks_of_a_possibility("I'm thinking about moving to Berlin."), speaks_of_a_possibility("We might move.")
    (True, True)
    >>> speaks_of_a_possibility("My appointment moved to May 3."), speaks_of_a_possibility("I moved. Maybe again.")
    (False, False)
    >>> speaks_of_a_possibility("I don't want to learn Spanish anymore.")
    False
    """
    said = stated_sentences(text) or sentences(text)
    return bool(said) and all((_POSSIBLE.search(s) is not None or _MAY.search(s) is not None)
                              and _REVISED.search(s) is None for s in said)


def replaces_no_fact(text: str) -> bool:
    """True when ``text`` says it adds (:func:`says_it_adds`) or speaks of a possibility
    (:func:`speaks_of_a_possibility`): either way a newer memory saying it replaces no older one.

    >>> replaces_no_fact("I also speak German."), replaces_no_fact("I'd love to live in Rome.")
    (True, True)
    >>> replaces_no_fact("I live in Rome.")
    False
    """
    return says_it_adds(text) or speaks_of_a_possibility(text)


_DAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
# a phrase that limits a statement to an occasion: "on weekends", "on Fridays", "in the summer", "on holiday",
# "when it rains", "sometimes" (a single day, "on Friday", is an event's date, not an occasion)
_OCCASION = re.compile(rf"\b(?:on (?:the )?(?:weekends|weekdays|{_DAY}s)|"
                       rf"at (?:the )?weekends?|every (?:weekend|{_DAY}s?|summer|winter)|"
                       rf"in (?:the )?(?:summer|winter|spring|autumn|fall)|on (?:holiday|holidays|vacation)|"
                       rf"when it(?:'s| is)?\b|whenever|sometimes|occasionally|once in a while|"
                       rf"from time to time|now and then)\b", re.IGNORECASE)
# any mention of the days, seasons or holidays a statement holds on: then an occasion may be its value
_WHEN = re.compile(rf"\b(?:{_DAY}s?|weekends?|weekdays?|summers?|winters?|spring|autumn|fall|holidays?|vacations?|"
                   rf"daily|every day|always|usually)\b", re.IGNORECASE)


class Occasion(NamedTuple):
    """What a text says of when it holds (:func:`occasion_of`): ``limited`` to an occasion ("on weekends"), and
    whether it ``named`` any days, seasons or holidays at all."""

    limited: bool = False
    named: bool = False


def occasion_of(text: str) -> Occasion:
    """:class:`Occasion` of ``text`` (:func:`limited_to_an_occasion`, :func:`names_when`).

    >>> occasion_of("On weekends I get around by ferry."), occasion_of("I commute by bus.")
    (Occasion(limited=True, named=True), Occasion(limited=False, named=False))
    """
    return Occasion(limited_to_an_occasion(text), names_when(text))


def exception_and_rule(a: Occasion, b: Occasion) -> bool:
    """Whether one of two texts is limited to an occasion and the other names no days, seasons or holidays
    (:func:`narrows_to_an_occasion`, on the texts' :func:`occasion_of`).

    >>> exception_and_rule(Occasion(limited=True, named=True), Occasion())
    True
    """
    return (a.limited and not b.named) or (b.limited and not a.named)


def narrows_to_an_occasion(older: str, newer: str) -> bool:
    """True when one text is limited to an occasion ("On weekends I get around by ferry.", "On Fridays I work from
    home.", "In the summer I drink iced tea.", "sometimes") and the other names no days, seasons or holidays at all
    ("I commute by bus."): one states an exception, the other the rule, and neither changes the other. (Before, "On
    Fridays I work from home." superseded "I work from the office." on write, and "I commute by train now."
    superseded "On weekends I get around by bike.".) When both name them ("My workout days are Sundays.", then "I
    go to the gym on Thursdays now."), the newer may well change the older's value.

    >>> narrows_to_an_occasion("I commute by bus.", "On weekends I get around by ferry.")
    True
    >>> narrows_to_an_occasion("My workout days are Sundays.", "I go to the gym on Thursdays now.")
    False
    >>> narrows_to_an_occasion("My dentist appointment is on March 3.", "The dentist moved it to Friday.")
    False
    """
    return exception_and_rule(occasion_of(older), occasion_of(newer))


def limited_to_an_occasion(text: str) -> bool:
    """Whether ``text`` has a phrase that limits it to an occasion ("on weekends", "in the summer", "sometimes").

    >>> limited_to_an_occasion("On Fridays I work from home."), limited_to_an_occasion("I work from home on Friday.")
    (True, False)
    """
    return _OCCASION.search(text) is not None


def names_when(text: str) -> bool:
    """Whether ``text`` names any days, seasons or holidays, or says "every day" / "always" / "usually".

    >>> names_when("My workout days are Sundays."), names_when("I commute by bus.")
    (True, False)
    """
    return _WHEN.search(text) is not None


def changed_value(older: str, newer: str) -> bool:
    """True when ``newer`` restates ``older`` with a value swapped (:func:`changed_span` of their tokens)."""
    return changed_span(statement_tokens(older), statement_tokens(newer)) is not None


__all__ = ["MAX_CHANGED", "MIN_SHARED", "Occasion", "changed_span", "changed_value", "exception_and_rule",
           "limited_to_an_occasion", "names_when", "narrows_to_an_occasion", "occasion_of", "only_asks",
           "replaces_no_fact", "says_it_adds", "sentence_count", "speaks_of_a_possibility", "stated_sentences",
           "statement_key", "statement_tokens"]
