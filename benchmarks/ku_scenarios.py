"""Knowledge-update scenarios, generated from templates (used by ``benchmarks/knowledge_update.py``).

A scenario is one user's memory stream: older statements of a fact (some repeated, in varied phrasings), unrelated
memories between them (chit-chat and *other* facts about the user, which must survive consolidation), then a newer
statement that replaces the fact, and a question about its current value.

Templates are split into two halves by attribute: ``"tune"`` (what the consolidation constants were chosen on) and
``"test"`` (held out: other attributes, other phrasings, other values). Report the held-out half.

Example:
    >>> s = scenarios("test", n=3, seed=0)
    >>> len(s), s[0].new_value != s[0].old_value
    (3, True)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# attribute: (statements of the old value, statements of a new value, questions, values)
# Statements and updates are phrased differently on purpose (the update rarely repeats the old frame).
_TUNE: dict[str, tuple[list[str], list[str], list[str], list[str]]] = {
    "city": (["I live in {v}.", "My home is in {v}.", "I've been living in {v} for a few years."],
             ["Actually I moved to {v} last month.", "I live in {v} now.", "We relocated to {v} recently."],
             ["Where do I live?", "Which city is my home?"],
             ["Lyon", "Paris", "Berlin", "Madrid", "Lisbon", "Toronto", "Osaka", "Denver", "Austin", "Prague"]),
    "employer": (["I work at {v}.", "My employer is {v}.", "I have a job at {v}."],
                 ["I just started a new job at {v}.", "I switched jobs, I'm at {v} now.", "These days I work for {v}."],
                 ["Where do I work?", "Who is my employer?"],
                 ["Google", "Siemens", "Airbus", "Netflix", "Spotify", "Shopify", "Nestle", "Philips", "Zalando"]),
    "color": (["My favorite color is {v}.", "I love the color {v} the most.", "{v} is my favourite colour."],
              ["My favorite color is {v} now.", "Lately my favourite colour has become {v}.",
               "I changed my mind, {v} is my favorite color."],
              ["What is my favorite color?", "Which colour do I like best?"],
              ["blue", "green", "red", "purple", "orange", "yellow", "teal", "black", "pink"]),
    "pet": (["My dog is called {v}.", "I have a dog named {v}.", "Our dog's name is {v}."],
            ["We renamed our dog, he is called {v} now.", "Our dog goes by {v} these days.",
             "The dog's new name is {v}."],
            ["What is my dog's name?", "What is our dog called?"],
            ["Rex", "Biscuit", "Luna", "Max", "Pepper", "Milo", "Rocky", "Bella", "Charlie"]),
    "car": (["I drive a {v}.", "My car is a {v}.", "I own a {v}."],
            ["I sold my old car and bought a {v}.", "My new car is a {v}.", "I'm driving a {v} now."],
            ["What car do I drive?", "Which car do I have?"],
            ["Toyota Corolla", "Volvo XC60", "Tesla Model 3", "Honda Civic", "Renault Clio", "Ford Focus",
             "Mazda 3", "Skoda Octavia"]),
    "partner": (["My girlfriend's name is {v}.", "I'm dating {v}.", "My partner is {v}."],
                ["I broke up and now I'm seeing {v}.", "My new girlfriend is {v}.", "I'm with {v} now."],
                ["What is my girlfriend's name?", "Who am I dating?"],
                ["Emma", "Sofia", "Claire", "Nina", "Julia", "Hannah", "Mia", "Laura", "Chloe"]),
}
_TEST: dict[str, tuple[list[str], list[str], list[str], list[str]]] = {
    "phone": (["My phone is a {v}.", "I use a {v} as my phone.", "I carry a {v}."],
              ["I upgraded my phone to a {v}.", "My phone is a {v} now.", "I got a new phone, a {v}."],
              ["What phone do I have?", "Which phone do I use?"],
              ["Pixel 8", "iPhone 15", "Galaxy S23", "Fairphone 5", "Xperia 1", "OnePlus 12", "Moto G"]),
    "food": (["My favorite food is {v}.", "I could eat {v} every day.", "Nothing beats {v} for me."],
             ["These days my favorite food is {v}.", "My new favourite dish is {v}.", "{v} is my favourite food now."],
             ["What is my favorite food?", "Which dish do I like most?"],
             ["lasagna", "ramen", "tacos", "sushi", "paella", "curry", "pho", "falafel", "risotto"]),
    "gym": (["I go to the gym on {v}.", "My workout days are {v}.", "I train at the gym every {v}."],
            ["I moved my gym sessions to {v}.", "Now I work out on {v}.", "My training days changed to {v}."],
            ["When do I go to the gym?", "Which days do I work out?"],
            ["Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays", "Sundays"]),
    "job": (["I work as a {v}.", "My job title is {v}.", "I'm employed as a {v}."],
            ["I got promoted, I'm a {v} now.", "I changed careers and became a {v}.", "My role is {v} now."],
            ["What is my job?", "What do I do for a living?"],
            ["nurse", "teacher", "data analyst", "architect", "chef", "pilot", "lawyer", "electrician"]),
    "language": (["I'm learning {v}.", "I take {v} lessons.", "I study {v} in the evenings."],
                 ["I stopped that and started learning {v} instead.", "Now I'm studying {v}.",
                  "I switched my language lessons to {v}."],
                 ["Which language am I learning?", "What language do I study?"],
                 ["Spanish", "Japanese", "German", "Italian", "Korean", "Portuguese", "Arabic", "Dutch"]),
    "commute": (["I commute by {v}.", "I get to work by {v}.", "Every morning I go to the office by {v}."],
                ["I commute by {v} now.", "These days I take the {v} to work.", "I switched my commute to {v}."],
                ["How do I get to work?", "How do I commute?"],
                ["bike", "train", "bus", "car", "scooter", "tram", "ferry"]),
}
# Statements that resemble an attribute's statements but are NOT updates of it (another person's value, a second
# value that coexists, a related habit): consolidation must keep both. ``{v}`` is a third value of the attribute.
_ALIKE: dict[str, list[str]] = {
    "city": ["I often travel to {v} for work.", "My parents live in {v}.", "I'd love to visit {v} someday."],
    "employer": ["My sister works at {v}.", "I had an interview at {v} years ago.", "My friend just joined {v}."],
    "color": ["My sister's favorite color is {v}.", "We painted the kitchen {v}.", "I bought a {v} jacket."],
    "pet": ["We also have a cat called {v}.", "My neighbour's dog is named {v}.", "My first dog was called {v}."],
    "car": ["My wife drives a {v}.", "I rented a {v} on holiday.", "My dad wants to buy a {v}."],
    "partner": ["My best friend is {v}.", "My sister is called {v}.", "I had lunch with my colleague {v}."],
    "phone": ["My daughter has a {v}.", "My work phone is a {v}.", "I'm thinking about getting a {v} for my mum."],
    "food": ["My husband's favorite food is {v}.", "I also really like {v}.", "I cooked {v} for friends last night."],
    "gym": ["I go swimming on {v}.", "My yoga class is on {v}.", "My son has football practice on {v}."],
    "job": ["My brother works as a {v}.", "My mother was a {v}.", "I once thought about becoming a {v}."],
    "language": ["I already speak {v} fluently.", "My wife is a native {v} speaker.", "My kids learn {v} at school."],
    "commute": ["My partner commutes by {v}.", "On weekends I get around by {v}.", "My colleague comes in by {v}."],
}
_CHATTER = [
    "The weather was lovely this weekend.", "I watched a documentary about whales.", "My sister visited yesterday.",
    "I need to buy more coffee filters.", "The meeting ran late again.", "I finished reading a thriller novel.",
    "We had pizza for dinner on Friday.", "My knee hurts a bit after running.", "The neighbours are renovating.",
    "I found a nice cafe near the station.", "The train was delayed this morning.", "I planted tomatoes on the balcony.",
    "My laptop battery is getting weak.", "I tried a new recipe with lentils.", "We are planning a trip in spring.",
    "I cleaned the garage on Sunday.", "I forgot my umbrella at the office.", "The concert tickets sold out fast.",
]


@dataclass
class Scenario:
    """One user's stream; ``memories`` in the order they are remembered (the newer statement last)."""

    attribute: str
    old_value: str
    new_value: str
    question: str
    memories: list[str] = field(default_factory=list)
    old_texts: list[str] = field(default_factory=list)  # every statement of the old value
    other_facts: list[tuple[str, str]] = field(default_factory=list)  # (statement, its value): must stay recallable
    alike: list[str] = field(default_factory=list)  # same attribute, not an update (must stay recallable too)


def scenarios(half: str, *, n: int, seed: int = 0, alike: float = 0.5) -> list[Scenario]:
    """``n`` scenarios from the ``"tune"`` or ``"test"`` half of the templates (deterministic for a seed); a share
    ``alike`` of them also hold a look-alike statement of the same attribute that is not an update."""
    if half not in ("tune", "test"):
        raise ValueError("half must be 'tune' or 'test'")
    table = _TUNE if half == "tune" else _TEST
    rng = random.Random(f"{half}-{seed}")
    return [_one(table, rng, alike) for _ in range(n)]


def _one(table: dict[str, tuple[list[str], list[str], list[str], list[str]]], rng: random.Random,
         alike: float) -> Scenario:
    attribute = rng.choice(sorted(table))
    stmts, updates, questions, values = table[attribute]
    old, new, third = rng.sample(values, 3)
    s = Scenario(attribute, old, new, rng.choice(questions))
    # older statements: 1-3, some repeated verbatim, some rephrased
    olds = [rng.choice(stmts).format(v=old) for _ in range(rng.randint(1, 3))]
    # other facts of the same user (a different attribute): consolidation must leave them alone
    others = [a for a in sorted(table) if a != attribute]
    for other in rng.sample(others, 2):
        o_stmts, _, _, o_values = table[other]
        value = rng.choice(o_values)
        s.other_facts.append((rng.choice(o_stmts).format(v=value), value))
    fillers = rng.sample(_CHATTER, rng.randint(2, 5))
    stream: list[str] = []
    for text in olds:
        stream.append(text)
        stream.extend(fillers[: rng.randint(0, 2)])
    pool = [t for t, _ in s.other_facts] + fillers
    if rng.random() < alike:
        s.alike.append(rng.choice(_ALIKE[attribute]).format(v=third))
        pool.append(s.alike[0])
    rng.shuffle(pool)
    stream.extend(pool)
    stream.append(rng.choice(updates).format(v=new))
    if s.alike and rng.random() < 0.5:  # a look-alike after the update must not retire it either
        stream.remove(s.alike[0])
        stream.append(s.alike[0])
    s.memories, s.old_texts = stream, olds
    return s


def alike_pairs(half: str, *, n: int, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """``n`` (statement of an attribute, look-alike statement, question, the statement's value) of one template half:
    the look-alike is not an update, so the statement still answers the question.

    >>> statement, alike, question, value = alike_pairs("test", n=1)[0]
    >>> value in statement and value not in alike
    True
    """
    table = _TUNE if half == "tune" else _TEST
    rng = random.Random(f"alike-{half}-{seed}")
    out = []
    for _ in range(n):
        attribute = rng.choice(sorted(table))
        statements, _, questions, values = table[attribute]
        value, third = rng.sample(values, 2)
        out.append((rng.choice(statements).format(v=value), rng.choice(_ALIKE[attribute]).format(v=third),
                    rng.choice(questions), value))
    return out


# Distinct facts (issue #37): two statements that differ in one value are two memories. Each template keeps its frame
# and swaps one value (a number, an amount with its unit, a date, a weekday, a name, a code); the question asks for
# the current value. Restatements change only case, spacing and punctuation: those must merge.
_SWAPS: list[tuple[str, str | None, list[str]]] = [
    ("I take {v} of amlodipine daily.", "What dose of amlodipine do I take?", ["5 mg", "10 mg", "2.5 mg", "20 mg"]),
    ("My bank PIN is {v}.", "What is my bank PIN?", ["4821", "4822", "1397", "7730"]),
    ("The team meeting is on {v} at ten.", "When is the team meeting?", ["Tuesday", "Thursday", "Monday", "Friday"]),
    ("My flight to Oslo is {v}.", "Which flight do I take to Oslo?", ["SK 4410", "SK 4401", "LH 872", "BA 761"]),
    ("My brother's name is {v}.", "What is my brother's name?", ["Tom", "Tim", "Luis", "Pavel"]),
    ("My rent is {v} a month.", "How much rent do I pay?", ["950 EUR", "1,050 EUR", "990 EUR", "1,200 EUR"]),
    ("The dentist appointment is on {v}.", "When is my dentist appointment?",
     ["March 3, 2027", "March 13, 2027", "April 3, 2027", "March 3, 2028"]),
    ("My locker at the gym is number {v}.", "Which locker do I use at the gym?", ["12", "21", "112", "7"]),
    ("note number {v} about gardening", None, [str(i) for i in range(40)]),
]


@dataclass
class DistinctPair:
    """An older and a newer statement that differ in one value, the memories before them, and a question about the
    current value (None: no single current value, e.g. numbered notes)."""

    older: str
    newer: str
    question: str | None
    before: list[str] = field(default_factory=list)


def distinct_pairs(n: int, *, seed: int = 0) -> list[DistinctPair]:
    """``n`` pairs that must not merge (deterministic for a seed).

    >>> p = distinct_pairs(2, seed=0)[0]
    >>> p.older != p.newer
    True
    """
    rng = random.Random(f"distinct-{seed}")
    out = []
    for _ in range(n):
        template, question, values = rng.choice(_SWAPS)
        old, new = rng.sample(values, 2)
        out.append(DistinctPair(template.format(v=old), template.format(v=new), question,
                                rng.sample(_CHATTER, rng.randint(0, 4))))
    return out


def restatements(n: int, *, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (statement, the same statement with other case / spacing / punctuation): these must merge.

    >>> [a != b for a, b in restatements(3, seed=0)]
    [True, True, True]
    """
    rng = random.Random(f"restate-{seed}")
    variants = [str.lower, lambda t: t.rstrip(".") + "!", lambda t: "  " + t.replace(" ", "  ", 1), str.upper,
                lambda t: t.rstrip(".")]
    out = []
    for _ in range(n):
        template, _, values = rng.choice(_SWAPS[:-1])
        text = template.format(v=rng.choice(values))
        out.append((text, rng.choice(variants)(text)))
    return out


__all__ = ["DistinctPair", "Scenario", "distinct_pairs", "restatements", "scenarios"]
