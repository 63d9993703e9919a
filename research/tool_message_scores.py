"""The recall score of tool results stored the way an agent stores them: a call and its result, through
``remember_messages`` (the result's text holds the call's arguments, the tool's name is its speaker).

research/score_stores.py's tool outputs, which the score's calibration was fitted on, are single lines that name
the tool (``get_weather(city="Oslo") -> {...}``). An agent's transcript keeps the name on the call, not in the
result, so this asks the same questions of the same results stored as tool messages, in stores of ``--size``
results over ``--seeds`` shuffles, and reports what ``Hit.score`` promises (related >= 0.5, unrelated <= 0.3), the
share of questions whose own result ranks first and the share whose own result a mount takes
(``recall_for_mount``, the default threshold), and how unrelated questions sharing a verb with the tools' names
("How do I get to the airport?" beside ``get_weather``) score. Last line JSON.

    python research/tool_message_scores.py --seeds 3 --size 8
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # research/

from score_stores import TOOLS  # noqa: E402

from agentmem import AgentMemory  # noqa: E402

# Written for this check, after the fit: never seen by research/fit_scores.py. (call line, question it answers)
HELD_OUT = [
    ('search_flights(origin="OSL", destination="LIS", date="2026-03-02") -> [{"flight": "TP751", "departs": "10:40", '
     '"arrives": "14:05", "price_eur": 189}]', "When does my flight to Lisbon leave?"),
    ('get_order(order_id="A-5521") -> {"status": "shipped", "carrier": "DHL", "tracking": "JD0146"}',
     "Has my order shipped yet?"),
    ('lookup_medication(name="metformin") -> {"max_daily_mg": 2000, "take_with": "meals"}',
     "Should I take metformin with food?"),
    ('get_forecast(city="Kyoto", days=3) -> [{"day": "Sat", "rain_mm": 12}, {"day": "Sun", "rain_mm": 0}]',
     "Will it rain in Kyoto this weekend?"),
    ('book_table(restaurant="Osteria Nonna", time="19:30", people=4) -> {"confirmed": true, "ref": "ON-88"}',
     "Is our dinner reservation confirmed?"),
    ('get_calendar_events(day="2026-04-09") -> [{"title": "Dentist", "start": "08:15"}, {"title": "Standup", '
     '"start": "09:30"}]', "What time is my dentist appointment on the 9th?"),
    ('currency_rate(base="GBP", quote="USD") -> {"rate": 1.27, "as_of": "2026-01-10"}',
     "What's the pound to dollar exchange rate?"),
    ('read_file(path="notes/todo.md") -> "- renew passport\n- call plumber\n- pay council tax"',
     "What is on my to-do list?"),
    ('query_crm(customer="Hollis & Co") -> {"owner": "Dana Reyes", "stage": "negotiation", "value_eur": 42000}',
     "Who owns the Hollis account?"),
    ('check_visa(passport="IN", destination="JP") -> {"visa_required": true, "processing_days": 5}',
     "Do I need a visa to travel to Japan with an Indian passport?"),
    ('get_bus_arrivals(stop="Kings Road 14") -> [{"line": "22", "minutes": 4}, {"line": "11", "minutes": 9}]',
     "When is the next bus at Kings Road?"),
    ('weather_alerts(region="Florida Keys") -> [{"type": "hurricane watch", "until": "Thu 18:00"}]',
     "Are there any storm warnings for the Florida Keys?"),
    ('nutrition_facts(food="avocado", grams=100) -> {"kcal": 160, "fat_g": 14.7, "fiber_g": 6.7}',
     "How many calories are in an avocado?"),
    ('list_pull_requests(repo="web-app", state="open") -> [{"id": 412, "title": "Dark mode"}, {"id": 415, "title": '
     '"Fix login redirect"}]', "Which pull requests are still open on the web app?"),
    ('get_sleep_data(night="2026-02-11") -> {"hours": 5.2, "deep_min": 38, "wake_ups": 4}',
     "How did I sleep last night?"),
    ('cinema_showtimes(movie="Dune: Part Three", cinema="Rex") -> ["17:10", "20:45"]',
     "When is Dune playing at the Rex?"),
    ('energy_usage(month="2026-01") -> {"kwh": 412, "cost_eur": 118.6, "vs_last_year_pct": -9}',
     "How much electricity did we use in January?"),
    ('find_charging_station(near="Gare de Lyon") -> [{"name": "Ionity Bercy", "kw": 350, "free": 3}]',
     "Where can I charge my electric car near Gare de Lyon?"),
    ('get_lab_results(test="cholesterol") -> {"ldl_mmol": 3.9, "hdl_mmol": 1.4, "flag": "borderline high"}',
     "What were my cholesterol results?"),
    ('hotel_search(city="Porto", checkin="2026-05-02", nights=2) -> [{"hotel": "Casa Ribeira", "eur_per_night": 96}]',
     "Which hotel did you find in Porto?"),
    ('get_library_loans(card="7781") -> [{"title": "The Overstory", "due": "2026-03-14"}]',
     "When do I have to return my library book?"),
    ('ping_host(host="db-primary") -> {"reachable": false, "last_seen": "03:12 UTC"}',
     "Is the primary database server up?"),
    ('tide_times(place="Saint-Malo", date="2026-07-20") -> {"high": ["06:41", "19:02"], "low": ["00:35", "12:58"]}',
     "When is high tide in Saint-Malo?"),
    ('get_subscription(user="me") -> {"plan": "family", "renews": "2026-09-01", "price_eur": 17.99}',
     "When does my subscription renew?"),
]

# Unrelated questions that share a verb with tools' names (get_, search_, check_, ...): a tool's name must not make
# its result an answer to any question using the verb
VERB_QUESTIONS = ["How do I get to the airport from here?", "Can you search for a good pizza place nearby?",
                  "Check whether I locked the front door.", "Make a list of birthday gift ideas for my sister.",
                  "Where can I find a cheap pharmacy?", "Look up the meaning of serendipity.",
                  "Read me a poem about the sea.", "Recommend a good book about history.", "Ping me when you are done.",
                  "I have a query about my gym membership."]

_CALL = re.compile(r"^(?P<name>[\w.]+)\((?P<args>.*)\) -> (?P<result>.*)$", re.S)
_ARG = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^,]+)')


def tool_call(line: str) -> tuple[str, dict, str]:
    """``name(k="v", n=1) -> result`` as (name, arguments, result).

    Example:
        >>> tool_call('get_weather(city="Oslo", days=2) -> {"temp_c": -4}')
        ('get_weather', {'city': 'Oslo', 'days': 2}, '{"temp_c": -4}')
        >>> tool_call('run_sql("SELECT 1") -> [[1]]')
        ('run_sql', {'arg': 'SELECT 1'}, '[[1]]')
    """
    m = _CALL.match(line)
    assert m, line
    raw = m["args"]
    if raw.startswith('"'):  # one positional string
        return m["name"], {"arg": json.loads(raw)}, m["result"]
    args = {k: json.loads(v) if v.startswith('"') or re.fullmatch(r"-?\d+(\.\d+)?", v) else v
            for k, v in _ARG.findall(raw)}
    return m["name"], args, m["result"]


def transcript(n: int, line: str) -> list[dict]:
    """The assistant's call and the tool's answer, as an OpenAI-shaped transcript stores them."""
    name, args, result = tool_call(line)
    call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": result}]


def stored(mem: AgentMemory, n: int, line: str, how: str) -> str:
    """Store one tool output (``how``: "messages", as an agent's transcript; "line", the fit's single line) and
    return its entry's id."""
    if how == "line":
        return mem.remember(line, user_id="u", kind="tool").id
    return mem.remember_messages(transcript(n, line), user_id="u")[0].id


def measure(seeds: int, size: int, how: str = "messages", items_of: str = "fit") -> dict:
    related, unrelated, first, mounted, verbs, verbs_mounted = [], [], [], [], [], []
    for seed in range(seeds):
        items = list(TOOLS if items_of == "fit" else HELD_OUT)
        random.Random(seed).shuffle(items)
        for start in range(0, len(items) - size + 1, size):
            store = items[start:start + size]
            with tempfile.TemporaryDirectory() as tmp, AgentMemory(tmp, kv_encoding="off") as mem:
                ids = [stored(mem, n, line, how) for n, (line, _) in enumerate(store)]
                for own, (_, question) in zip(ids, store):
                    hits = mem.recall(question, user_id="u", k=size)
                    related += [h.score for h in hits if h.id == own]
                    unrelated += [h.score for h in hits if h.id != own]
                    first.append(hits[0].id == own)
                    mounted.append(own in {h.id for h in mem.recall_for_mount(question, user_id="u")})
                for question in VERB_QUESTIONS:
                    verbs += [h.score for h in mem.recall(question, user_id="u", k=size)]
                    verbs_mounted.append(len(mem.recall_for_mount(question, user_id="u")))
    return {"questions": len(first), "related>=0.5": round(statistics.fmean(s >= 0.5 for s in related), 4),
            "unrelated<=0.3": round(statistics.fmean(s <= 0.3 for s in unrelated), 4),
            "related_mean": round(statistics.fmean(related), 4),
            "unrelated_mean": round(statistics.fmean(unrelated), 4),
            "own_first": round(statistics.fmean(first), 4), "own_mounted": round(statistics.fmean(mounted), 4),
            "verb_questions<=0.3": round(statistics.fmean(s <= 0.3 for s in verbs), 4),
            "verb_questions_max": round(max(verbs), 4),
            "verb_questions_mounted_per_question": round(statistics.fmean(verbs_mounted), 4),
            "config": {"seeds": seeds, "size": size, "stored_as": how, "items": items_of}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--as", dest="how", nargs="+", default=["line", "messages"], choices=["line", "messages"])
    p.add_argument("--items", nargs="+", default=["fit", "held_out"], choices=["fit", "held_out"],
                   help="the fit's tool outputs (research/score_stores.py) or those written after it")
    args = p.parse_args()
    print(json.dumps({f"{items}_{how}": measure(args.seeds, args.size, how, items) for items in args.items
                      for how in args.how}))


if __name__ == "__main__":
    main()
