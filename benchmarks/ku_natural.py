"""Natural knowledge updates: hand-written pairs of an older statement and the newer one that changes it, phrased as
people tell an assistant (used by ``benchmarks/knowledge_update.py --natural``).

The template scenarios of ``ku_scenarios.py`` restate an attribute in a frame ("I work as a {v}." / "My role is {v}
now."); here the newer statement rarely repeats the older one's frame: a dose is *raised*, an appointment *moved*,
a meeting *cancelled*, an allergy *ruled out*, a job *quit*. Each pair is one new user's store: a few unrelated
memories, the older statement in a first session, the newer one in a later session, and a question whose answer is
the newer one (it states the current value, or that the older no longer holds).

``DESIGN`` are the eight pairs a rule may be designed on (they were looked at first, session 15); the rest were
written before any change and are the check. Report both. What a rule must not do is checked on look-alikes of the
held-out template half (``alike_cases``): a user's statement and, a session later, a statement that resembles it but
is no update ("My phone is a Pixel 8." / "My daughter has a Galaxy S23."); the user's own statement still answers.
Nor is a second value of an attribute that holds several (``added_cases``: "I speak French." / "I also speak
German."), said with "also" / "too" / "as well" or without.

People rarely tell a fact in a message of its own: ``wrapped="older"`` (or True) says each older statement inside a
chat message with a greeting and / or another sentence about something else ("Hi! I'm allergic to penicillin. I found
a nice cafe near the station."), as a chat's user turn is stored (one memory per message); ``wrapped="both"`` the
newer statement too.

Example:
    >>> len(NATURAL) >= 40, all(len(p) == 3 for p in NATURAL), len(DESIGN)
    (True, True, 8)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ku_scenarios import alike_pairs

# (older statement, newer statement, question answered by the newer)
DESIGN: list[tuple[str, str, str]] = [
    ("I'm allergic to penicillin.",
     "Good news: the allergy test was wrong, I'm not allergic to penicillin after all.",
     "Am I allergic to any medication?"),
    ("I love sushi and eat it every week.", "I stopped eating fish, I'm vegan now.", "What food do I eat?"),
    ("My dentist appointment is on March 3.", "The dentist moved my appointment to March 10.",
     "When is my dentist appointment?"),
    ("I take 20 mg of lisinopril every morning.", "My doctor raised my lisinopril to 40 mg.",
     "What dose of lisinopril do I take?"),
    ("I work at Google as a designer.", "I quit Google last week.", "Where do I work?"),
    ("My sister Anna lives in Berlin.", "Anna moved to Madrid in June.", "Where does my sister live?"),
    ("I work as a paralegal.", "I got promoted, I'm a lawyer now.", "What is my job?"),
    ("We're meeting Tom on Friday at 3pm.", "Tom cancelled Friday's meeting.", "When am I meeting Tom?"),
]
CHECK: list[tuple[str, str, str]] = [
    ("My metformin dose is 500 mg twice a day.", "The doctor bumped my metformin up to 1000 mg.",
     "How much metformin do I take?"),
    ("I take my thyroid pill at 7am.", "I now take the thyroid pill at bedtime instead.",
     "When do I take my thyroid pill?"),
    ("My flight to Denver leaves on the 12th.", "The airline rebooked my Denver flight to the 14th.",
     "When does my flight to Denver leave?"),
    ("The book club meets on Tuesdays.", "Book club switched to Thursdays from next month.",
     "When does the book club meet?"),
    ("My landlord charges me 1,200 a month.", "Rent went up to 1,350 this year.", "How much is my rent?"),
    ("I drive a blue Honda Civic.", "I sold the Civic and bought an electric Kia.", "What car do I drive?"),
    ("My manager is Priya.", "Priya left the company, my new manager is Daniel.", "Who is my manager?"),
    ("I'm training for the Boston marathon in April.", "I pulled out of the Boston marathon because of my knee.",
     "Am I running the Boston marathon?"),
    ("My son's soccer practice is at 5pm.", "Coach moved soccer practice to 6:30.",
     "What time is my son's soccer practice?"),
    ("I'm vegetarian.", "I started eating chicken again last month.", "Do I eat meat?"),
    ("My wifi password is sunflower22.", "I changed the wifi password to maple-77.", "What is my wifi password?"),
    ("I live on Elm Street.", "We finally moved out of Elm Street, we're on Harbor Road now.",
     "What street do I live on?"),
    ("My daughter goes to Lincoln Elementary.", "We transferred my daughter to Oakwood Academy.",
     "Which school does my daughter attend?"),
    ("I'm on the keto diet.", "I gave up keto, it wasn't working for me.", "What diet am I on?"),
    ("The project deadline is November 30.", "The client pushed the project deadline to mid-January.",
     "When is the project deadline?"),
    ("My gym membership is at FitLife.", "I cancelled FitLife and joined the climbing gym downtown.",
     "Which gym do I go to?"),
    ("I'm learning the violin.", "I quit violin lessons, too expensive.", "Am I still learning an instrument?"),
    ("My brother lives with me.", "My brother got his own apartment and moved out.", "Who lives with me?"),
    ("I have a standing desk at work.", "They took away the standing desks at the office.",
     "Do I have a standing desk?"),
    ("Our anniversary dinner is booked at Luigi's.", "Luigi's closed, so we booked the anniversary dinner at Sora.",
     "Where is our anniversary dinner?"),
    ("I'm allergic to cats.", "Turns out it was dust, not cats; I'm fine around cats.", "Am I allergic to cats?"),
    ("My therapist appointments are every Monday.", "My therapist only sees me every other Wednesday now.",
     "When do I see my therapist?"),
    ("I use a Pixel phone.", "Switched to an iPhone after the Pixel died.", "What phone do I use?"),
    ("I'm saving for a house.", "We bought the house! No more saving for it.", "Am I saving for a house?"),
    ("I drink four coffees a day.", "I cut coffee down to one cup in the morning.", "How much coffee do I drink?"),
    ("My emergency contact is my mom.", "Please use my husband Raj as my emergency contact from now on.",
     "Who is my emergency contact?"),
    ("The wedding is in Napa in June.", "We moved the wedding to Lake Tahoe in September.",
     "Where and when is the wedding?"),
    ("I work from the office every day.", "My company went fully remote, I work from home now.",
     "Where do I work from?"),
    ("My blood pressure target is under 140.", "My cardiologist lowered my blood pressure target to 130.",
     "What is my blood pressure target?"),
    ("I play tennis on Saturday mornings.", "My tennis partner moved away, so no more Saturday tennis.",
     "Do I play tennis on Saturdays?"),
    ("I bank with Chase.", "I closed my Chase account and moved everything to a credit union.",
     "Which bank do I use?"),
    ("The team standup is at 9:30.", "Standup is at 10 starting this week.", "What time is the team standup?"),
    ("My cat eats dry food only.", "The vet put my cat on a wet-food diet.", "What does my cat eat?"),
    ("I'm renting a flat in Leeds.", "I've just signed for a flat in Manchester and left Leeds.",
     "Where do I rent a flat?"),
]
NATURAL = DESIGN + CHECK
OPENERS = ["Hi!", "Hello again.", "Good morning!", "Hey there.", "Quick note for you."]
FILLERS = [
    "The weather was lovely this weekend.", "I watched a documentary about whales.", "I need to buy coffee filters.",
    "I finished reading a thriller novel.", "The neighbours are renovating their kitchen.",
    "I found a nice cafe near the station.", "I planted tomatoes on the balcony.", "My laptop battery is getting weak.",
    "I tried a new recipe with lentils.", "I cleaned the garage on Sunday.", "The concert tickets sold out fast.",
    "I forgot my umbrella at the office.",
]


@dataclass(frozen=True)
class NaturalCase:
    """One user's store: ``stream`` as (text, session id) in write order, the older and newer statement in it;
    ``group`` is ``"design"``, ``"check"`` or ``"alike"`` (the newer is a look-alike: the older still answers)."""

    older: str
    newer: str
    question: str
    stream: tuple[tuple[str, str], ...]
    group: str
    echo: str | None = None  # the assistant's reply to the older statement, restating it (written right after it)


def natural_cases(*, fillers: int = 4, seed: int = 0, wrapped: bool | str = False,
                  echoed: bool = False) -> list[NaturalCase]:
    """Every pair as a store: ``fillers`` unrelated memories (half in the first session before the older statement,
    the rest in a middle session), the older statement in session ``s1``, the newer in ``s3`` (``wrapped``: the
    older, or ``"both"``, inside a longer message, :func:`wrap`; ``echoed``: the assistant's reply restating the
    older, :func:`echo`).

    >>> case = natural_cases(fillers=2)[0]
    >>> [session for _, session in case.stream], case.group
    (['s1', 's1', 's2', 's3'], 'design')
    """
    rng = random.Random(f"natural-{seed}")
    groups = ["design"] * len(DESIGN) + ["check"] * len(CHECK)
    return [_case(older, newer, question, group, rng, fillers, wrapped, echoed)
            for (older, newer, question), group in zip(NATURAL, groups)]


def alike_cases(n: int = 40, *, fillers: int = 4, seed: int = 0, wrapped: bool | str = False,
                echoed: bool = False) -> list[NaturalCase]:
    """``n`` stores built like :func:`natural_cases` from the held-out template half's look-alikes: the user's own
    statement in ``s1``, the look-alike in ``s3``.

    >>> case = alike_cases(1)[0]
    >>> case.group, case.stream[-1][0] == case.newer
    ('alike', True)
    """
    rng = random.Random(f"natural-alike-{seed}")
    return [_case(statement, alike, question, "alike", rng, fillers, wrapped, echoed)
            for statement, alike, question, _ in alike_pairs("test", n=n, seed=seed)]


# a second value of an attribute that holds several (languages, allergies, siblings, pets): no update, the older still
# answers. Each as the user would say it (marked: "also", "too", "as well") and bare. The first three were looked at
# when statements.says_it_adds was written (round 3 session 22); the other nine were written after, as the check.
ADDED = [
    ("I speak French.", "I also speak German.", "I speak German.", "Which languages do I speak?"),
    ("I'm allergic to penicillin.", "I'm allergic to peanuts too.", "I'm allergic to peanuts.",
     "What am I allergic to?"),
    ("I have a sister called Anna.", "I also have a sister called Mia.", "I have a sister called Mia.",
     "What are my sisters called?"),
    ("I collect stamps.", "I also collect old coins.", "I collect old coins.", "What do I collect?"),
    ("I play the guitar.", "I play the piano as well.", "I play the piano.", "Which instruments do I play?"),
    ("We have a dog called Rex.", "We also have a cat called Tom.", "We have a cat called Tom.", "What pets do we have?"),
    ("I play tennis on Sundays.", "I also play chess on Sundays.", "I play chess on Sundays.",
     "What do I do on Sundays?"),
    ("My son Leo plays football.", "My son Leo also does judo.", "My son Leo does judo.", "What sports does Leo do?"),
    ("I take vitamin D every morning.", "I take magnesium in the evening too.", "I take magnesium in the evening.",
     "Which supplements do I take?"),
    ("I've been to Japan.", "I've also been to Peru.", "I've been to Peru.", "Which countries have I visited?"),
    ("I volunteer at the food bank.", "I also volunteer at the animal shelter.", "I volunteer at the animal shelter.",
     "Where do I volunteer?"),
    ("I read mystery novels.", "I read science fiction as well.", "I read science fiction.", "What books do I read?"),
]


def added_cases(*, fillers: int = 4, seed: int = 0, wrapped: bool | str = False,
                echoed: bool = False) -> list[NaturalCase]:
    """Stores built like :func:`natural_cases` from :data:`ADDED`: the first value in ``s1``, a second one in ``s3``,
    said with a word that marks it as added (group ``"added"``) and without (``"added_bare"``).

    >>> cases = added_cases(fillers=0)
    >>> [c.group for c in cases[:2]], cases[0].newer
    (['added', 'added_bare'], 'I also speak German.')
    """
    rng = random.Random(f"natural-added-{seed}")
    return [_case(first, second, question, group, rng, fillers, wrapped, echoed)
            for first, marked, bare, question in ADDED for group, second in (("added", marked), ("added_bare", bare))]


# the user's statement and one of a relative's about the same kind of thing (no update of either): written after
# subjects.py's rule (round 3 session 23) and run once, as its check. Each pair both ways round: the user's first,
# asked about the user (group "others"), and the relative's first, asked about the relative ("others_asked").
OTHERS = [
    ("I'm a vegetarian.", "My dad is a huge meat eater.", "What diet do I follow?", "What does my dad eat?"),
    ("I live in Lisbon.", "My sister lives in Porto.", "Where do I live?", "Where does my sister live?"),
    ("I'm 34 years old.", "My brother turned 40 last week.", "How old am I?", "How old is my brother?"),
    ("I work night shifts at the hospital.", "My wife works regular office hours.", "What hours do I work?",
     "What hours does my wife work?"),
    ("I'm allergic to shellfish.", "My son is allergic to peanuts.", "What am I allergic to?",
     "What is my son allergic to?"),
    ("My favourite band is Radiohead.", "My girlfriend's favourite band is Coldplay.", "What is my favourite band?",
     "What is my girlfriend's favourite band?"),
    ("I drive a Volkswagen Golf.", "My neighbour drives a Tesla.", "What car do I drive?",
     "What car does my neighbour drive?"),
    ("I go running every morning.", "My husband goes cycling every morning.", "What do I do every morning?",
     "What does my husband do every morning?"),
    ("I studied history at university.", "My daughter studies medicine.", "What did I study?",
     "What does my daughter study?"),
    ("I speak Portuguese at home.", "My grandmother only speaks Italian.", "Which language do I speak at home?",
     "Which language does my grandmother speak?"),
    ("I support Arsenal.", "My best friend supports Chelsea.", "Which football team do I support?",
     "Which team does my best friend support?"),
    ("I'm saving up for a trip to Japan.", "My cousin is saving for a car.", "What am I saving for?",
     "What is my cousin saving for?"),
]


def others_cases(*, fillers: int = 4, seed: int = 0, wrapped: bool | str = False,
                 echoed: bool = False) -> list[NaturalCase]:
    """Stores built like :func:`natural_cases` from :data:`OTHERS`: the user's statement in ``s1`` and the
    relative's in ``s3``, asked about the user (group ``"others"``), and the other way round, asked about the
    relative (``"others_asked"``); in both the older still answers.

    >>> [(c.group, c.older) for c in others_cases(fillers=0)[:2]]
    [('others', "I'm a vegetarian."), ('others_asked', 'My dad is a huge meat eater.')]
    """
    rng = random.Random(f"natural-others-{seed}")
    return [case for mine, theirs, about_me, about_them in OTHERS
            for case in (_case(mine, theirs, about_me, "others", rng, fillers, wrapped, echoed),
                         _case(theirs, mine, about_them, "others_asked", rng, fillers, wrapped, echoed))]


# a fact and, a session later, a plan, wish or possibility about it (nothing has changed yet, the older still
# answers): written after statements.speaks_of_a_possibility (round 3 session 23) and run once, as its check
POSSIBLE = [
    ("I work at Siemens.", "I'm considering an offer from Bosch.", "Where do I work?"),
    ("My rent is 900 euros a month.", "The landlord might raise the rent to 1,000 euros.", "How much is my rent?"),
    ("I have a Samsung TV.", "I'd like to get an LG OLED at some point.", "What TV do I have?"),
    ("I go to bed at 11pm.", "Maybe I should start going to bed at 10.", "When do I go to bed?"),
    ("My daughter's school is Riverside Primary.", "We're thinking of moving her to Hillcrest.",
     "Which school does my daughter go to?"),
    ("I take the bus to work.", "I want to start cycling to work in spring.", "How do I get to work?"),
    ("The team meeting is on Mondays at 9.", "The manager may move the team meeting to Tuesdays.",
     "When is the team meeting?"),
    ("I'm a member of FitLife gym.", "I'm planning to switch to the climbing gym.", "Which gym am I a member of?"),
    ("I drink two coffees a day.", "I hope to cut down to one coffee a day.", "How much coffee do I drink?"),
    ("I play bass in a band.", "Someday I'd love to play guitar in a band.", "What do I play in the band?"),
    ("My insulin dose is 10 units at night.", "My doctor might increase my insulin to 12 units.",
     "What is my insulin dose?"),
    ("We rent a flat in Leeds.", "We plan to buy a house in York next year.", "Where do we live?"),
]


# a general fact and, a session later, an exception limited to an occasion (the fact still holds otherwise):
# written after statements.narrows_to_an_occasion (round 3 session 23) and run once, as its check
OCCASIONS = [
    ("I cycle to work.", "When it snows I take the tram.", "How do I get to work?"),
    ("I eat lunch at my desk.", "On Fridays we go out for lunch.", "Where do I eat lunch?"),
    ("I wake up at 6:30.", "On weekends I sleep in until nine.", "What time do I wake up?"),
    ("I shop at Lidl.", "Sometimes I go to the farmers' market.", "Where do I do my shopping?"),
    ("I wear glasses.", "Occasionally I wear contact lenses.", "Do I wear glasses?"),
    ("I work from the office in Leeds.", "In the summer I work from our Lisbon office.", "Where do I work from?"),
    ("I drink green tea in the morning.", "On holiday I drink espresso.", "What do I drink in the morning?"),
    ("I take the dog to the park.", "On rainy days I walk the dog around the block.", "Where do I walk the dog?"),
    ("I read the news on my phone.", "At weekends I read the paper edition.", "How do I read the news?"),
    ("I play football with friends.", "In the winter I play indoor five-a-side.", "What sport do I play?"),
    ("I park in the office garage.", "On Mondays I park on the street.", "Where do I park?"),
    ("I have porridge for breakfast.", "Every Sunday I make pancakes.", "What do I have for breakfast?"),
]


# newer statements that change no fact, by group: the older still answers
KEPT = {"possible": POSSIBLE, "occasion": OCCASIONS}


def kept_cases(*, fillers: int = 4, seed: int = 0, wrapped: bool | str = False,
               echoed: bool = False) -> list[NaturalCase]:
    """Stores built like :func:`natural_cases` from :data:`KEPT`: the fact in ``s1``, the newer statement in ``s3``
    (group ``"possible"``: a plan or possibility; ``"occasion"``: an exception limited to an occasion); the older
    still answers.

    >>> [(c.group, c.newer) for c in kept_cases(fillers=0)[::12]]
    [('possible', "I'm considering an offer from Bosch."), ('occasion', 'When it snows I take the tram.')]
    """
    out = []
    for group, pairs in KEPT.items():
        rng = random.Random(f"natural-{group}-{seed}")
        out += [_case(fact, newer, question, group, rng, fillers, wrapped, echoed) for fact, newer, question in pairs]
    return out


def wrap(statement: str, rng: random.Random, asides: list[str]) -> str:
    """``statement`` inside a chat message: after a greeting, before a sentence about something else (one of
    ``asides``), or both.

    >>> [wrap("I live in Lyon.", random.Random(seed), ["I planted tomatoes."]) for seed in (0, 2)]
    ['I live in Lyon. I planted tomatoes.', 'Hi! I live in Lyon.']
    """
    form = rng.choice(("opener", "aside", "both"))
    parts = [rng.choice(OPENERS)] if form in ("opener", "both") else []
    parts.append(statement)
    if form in ("aside", "both"):
        parts.append(rng.choice(asides))
    return " ".join(parts)


ACKS = ["Got it:", "Noted,", "Thanks for telling me:", "Okay,", "Understood:"]
_SECOND_PERSON = {"i": "you", "i'm": "you're", "i've": "you've", "i'll": "you'll", "i'd": "you'd", "me": "you",
                  "my": "your", "mine": "yours", "we": "you", "we're": "you're", "our": "your", "am": "are"}


def echo(statement: str, rng: random.Random) -> str:
    """An assistant's reply that restates ``statement`` back to the user: an acknowledgement, then the statement in
    the second person (word by word, which is enough for these first-person facts).

    >>> echo("I take 20 mg of lisinopril every morning.", random.Random(0))
    'Okay, you take 20 mg of lisinopril every morning.'
    >>> echo("My sister Anna lives in Berlin.", random.Random(1))
    'Noted, your sister Anna lives in Berlin.'
    """
    words = [_SECOND_PERSON.get(w.lower(), w) for w in statement.split(" ")]
    return f"{rng.choice(ACKS)} {' '.join(words)}"


def _case(older: str, newer: str, question: str, group: str, rng: random.Random, fillers: int,
          wrapped: bool | str = False, echoed: bool = False) -> NaturalCase:
    # of the statement itself, not of its wrapping message; its own generator, so the rest of the case is unchanged
    said = echo(older, random.Random(older)) if echoed else None
    chosen = rng.sample(FILLERS, fillers)
    if wrapped:
        older = wrap(older, rng, [t for t in FILLERS if t not in chosen])
    if wrapped == "both":
        newer = wrap(newer, rng, [t for t in FILLERS if t not in chosen and t not in older])
    first, middle = chosen[: fillers // 2], chosen[fillers // 2 :]
    stream = [(t, "s1") for t in first] + [(older, "s1")] + [(t, "s2") for t in middle] + [(newer, "s3")]
    return NaturalCase(older, newer, question, tuple(stream), group, said)


__all__ = ["ACKS", "ADDED", "CHECK", "DESIGN", "KEPT", "NATURAL", "OCCASIONS", "OPENERS", "POSSIBLE", "NaturalCase",
           "added_cases", "alike_cases", "echo", "kept_cases", "natural_cases", "others_cases", "wrap"]
