"""Small hand-written stores for the recall score's fit (research/fit_scores.py): facts, preferences, tool outputs
and documents, each memory with a question it answers, the questions worded both close to the memory and as
paraphrases. A store holds a few memories of different topics, so each question has one memory that answers it and
the others that do not (the unrelated pairs).

The dev halves of LoCoMo and REALTALK are conversations; these are the other shapes ``Hit.score`` must mean the
same on (issue #38). The memories and questions here are not the ones the tests check (tests/unit/
test_score_meaning.py uses its own), so the tests are held out of this fit.

Example:
    >>> stores = small_stores(seed=0, size=6)
    >>> sorted({item.kind for store in stores for item in store})
    ['fact', 'knowledge', 'preference', 'tool']
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One memory and a question it answers; ``kind`` is the store's kind for it (turn, tool or knowledge)."""

    kind: str
    text: str
    question: str

    @property
    def store_kind(self) -> str:
        return {"fact": "turn", "preference": "turn", "tool": "tool", "knowledge": "knowledge"}[self.kind]


FACTS = [
    ("My son's football practice is on Tuesdays at 5 pm.", "When is my son's football practice?"),
    ("I was born in Valparaíso, Chile.", "Where was I born?"),
    ("My wife Aiko works as a veterinarian.", "What does my wife do for a living?"),
    ("Our wedding anniversary is on the 3rd of September.", "When is our anniversary?"),
    ("I drive a blue 2016 Honda Civic.", "What car do I have?"),
    ("My landlord's name is Mr. Okafor.", "Who is my landlord?"),
    ("I broke my left wrist skiing in 2019.", "Have I ever had an injury?"),
    ("My grandmother turns 90 next March.", "How old will my grandmother be next year?"),
    ("The Wi-Fi password at the cabin is 'pinecone42'.", "What's the wifi code at the cabin?"),
    ("I have a peanut allergy.", "Am I allergic to anything?"),
    ("My passport expires in August 2027.", "When does my passport run out?"),
    ("We adopted a grey tabby cat named Biscuit.", "What is our cat's name?"),
    ("I work night shifts at the hospital on weekends.", "What hours do I work on Saturdays?"),
    ("My brother Tomás lives in Montreal.", "Which city is my brother in?"),
    ("I started a new job at a solar energy startup in January.", "Where do I work now?"),
    ("My dentist appointment is next Thursday at 9:30.", "When am I seeing the dentist?"),
    ("I ran my first marathon in Berlin in 3 hours 52 minutes.", "What was my marathon time?"),
    ("My blood type is O negative.", "What is my blood type?"),
    ("Our flat is on the fourth floor and has no lift.", "Does my building have an elevator?"),
    ("My daughter Lena is learning to play the violin.", "Which instrument does Lena play?"),
    ("I owe Priya 40 euros for the concert tickets.", "How much money do I owe Priya?"),
    ("The kids' school closes early on Fridays, at 1 pm.", "What time does school finish on Friday?"),
    ("I am training for a half marathon in October.", "What race am I preparing for?"),
    ("My mother's surgery went well and she is home now.", "How is my mom doing after the operation?"),
    ("We are moving to Rotterdam in the spring.", "Where are we relocating?"),
    ("I keep the spare house key under the blue flowerpot.", "Where is the extra key hidden?"),
    ("My car insurance renews on the 1st of June.", "When is my auto policy up for renewal?"),
    ("I studied marine biology at the University of Bergen.", "What did I major in at university?"),
]

PREFERENCES = [
    ("I prefer aisle seats on long flights.", "Which seat should I book on the plane?"),
    ("I'm vegetarian and I don't eat fish either.", "Can I order the salmon for him?"),
    ("I like my coffee black, no sugar.", "How do I take my coffee?"),
    ("Please never schedule meetings before 10 am.", "Can you book a 8:30 call for me?"),
    ("I hate horror movies.", "Should we watch a scary film tonight?"),
    ("I prefer replies in Spanish when it's about family.", "Which language should you use for family topics?"),
    ("My favourite cuisine is Ethiopian food.", "What kind of restaurant would I enjoy?"),
    ("I'd rather take the train than fly for trips under 500 km.", "How should I travel from Paris to Lyon?"),
    ("I like short answers without bullet points.", "How should you format your responses to me?"),
    ("I don't drink alcohol.", "Would I like a glass of wine with dinner?"),
    ("Dark mode everywhere, please.", "Which theme do I want in the app?"),
    ("I love hiking in the mountains on weekends.", "What do I enjoy doing on Saturdays?"),
    ("I always want receipts sent to my work email.", "Where should the invoice go?"),
    ("I can't stand loud open-plan offices.", "What kind of workspace suits me?"),
    ("My favourite colour is emerald green.", "What colour should the birthday present be?"),
    ("I prefer paperbacks to e-books.", "Should I get the Kindle edition?"),
    ("I'm allergic to cats, so no pet-friendly rentals.", "Is a flat with a cat okay for me?"),
    ("I like to run early in the morning, around 6.", "When do I usually go jogging?"),
    ("Window table, quiet corner, if possible.", "Where do I like to sit in restaurants?"),
    ("I want my news summaries in the evening, not the morning.", "When should you send my daily digest?"),
    ("I prefer metric units.", "Should distances be in miles or kilometres?"),
    ("I'm learning Japanese, so add the kana where you can.", "Should you include Japanese script?"),
    ("I like spicy food, the hotter the better.", "How much chili should I add to my curry?"),
    ("Don't call me on Sundays, text instead.", "Can you phone me this Sunday?"),
    ("I prefer jazz when I'm working.", "What music should play while I focus?"),
]

TOOLS = [
    ('get_weather(city="Oslo") -> {"temp_c": -4, "conditions": "light snow", "wind_kmh": 12}',
     "What's the weather like in Oslo?"),
    ('calendar.list(date="2024-05-14") -> [{"title": "Piano lesson", "start": "16:00"}]',
     "Do I have anything on the 14th of May?"),
    ('stock_quote(symbol="ACME") -> {"price": 132.40, "currency": "USD", "change_pct": -1.8}',
     "How is ACME stock doing today?"),
    ('flight_status(number="KL1234") -> {"status": "delayed", "new_departure": "18:45", "gate": "D7"}',
     "Is my KLM flight on time?"),
    ('convert_currency(amount=250, from="EUR", to="JPY") -> {"result": 40125, "rate": 160.5}',
     "How many yen is 250 euros?"),
    ('search_contacts(name="Dr. Imani") -> {"phone": "+44 20 7946 0321", "email": "imani@clinic.example"}',
     "What's Dr. Imani's phone number?"),
    ('package_tracking(id="1Z999AA1") -> {"status": "out for delivery", "eta": "today 14:00-18:00"}',
     "When will my parcel arrive?"),
    ('run_sql("SELECT count(*) FROM orders WHERE status=\'refunded\'") -> [[37]]',
     "How many orders were refunded?"),
    ('get_balance(account="savings") -> {"balance": 8421.55, "currency": "EUR"}',
     "How much is in my savings account?"),
    ('translate(text="Where is the station?", to="de") -> "Wo ist der Bahnhof?"',
     "How do you say 'where is the station' in German?"),
    ('distance(from="Madrid", to="Barcelona", mode="driving") -> {"km": 621, "duration": "6 h 5 min"}',
     "How long is the drive from Madrid to Barcelona?"),
    ('restaurant_search(area="Trastevere", cuisine="pizza") -> [{"name": "Da Enzo", "rating": 4.6}]',
     "Any good pizza places in Trastevere?"),
    ('git_log(repo="billing", n=1) -> {"sha": "a91f3c2", "author": "maria", "message": "fix rounding in VAT"}',
     "What was the last commit in the billing repo?"),
    ('air_quality(city="Delhi") -> {"aqi": 312, "category": "hazardous", "pm25": 241}',
     "Is the air safe to breathe in Delhi right now?"),
    ('check_inventory(sku="CHAIR-OAK-02") -> {"in_stock": 0, "restock_date": "2024-07-02"}',
     "Is the oak chair available?"),
    ('disk_usage(path="/var/log") -> {"used_gb": 48.2, "free_gb": 1.3, "percent": 97}',
     "How full is the log disk?"),
    ('get_exchange_hours(market="NYSE") -> {"open": "09:30", "close": "16:00", "tz": "America/New_York"}',
     "When does the New York stock exchange open?"),
    ('train_times(from="Utrecht", to="Amsterdam") -> [{"depart": "08:12", "platform": 5}, {"depart": "08:27"}]',
     "When is the next train from Utrecht to Amsterdam?"),
    ('recipe_lookup(dish="shakshuka") -> {"time_min": 30, "serves": 4, "key": ["eggs", "tomatoes", "cumin"]}',
     "What do I need to make shakshuka?"),
    ('uptime(service="api-gateway") -> {"uptime_30d": 99.82, "incidents": 2}',
     "How reliable has the API gateway been this month?"),
    ('parking_search(near="Central Station") -> [{"garage": "P+R Noord", "free_spaces": 54, "eur_per_h": 2.5}]',
     "Where can I park near the central station?"),
    ('pharmacy_hours(name="Apotheek Zuid") -> {"mon_fri": "08:00-20:00", "sat": "09:00-17:00", "sun": "closed"}',
     "Is the pharmacy open on Sunday?"),
]

DOCUMENTS = [
    ("Returns: online orders can be returned within 30 days of delivery; refunds go to the original payment "
     "method within 5 business days.", "How long do I have to send back something I bought online?"),
    ("To reset the router, hold the recessed button on the back for 10 seconds until the status light blinks "
     "amber.", "How do I factory reset my router?"),
    ("Employees accrue 2.08 vacation days per month; unused days carry over up to a maximum of 10.",
     "How many holiday days can I carry into next year?"),
    ("The API rate limit is 600 requests per minute per key; exceeding it returns HTTP 429 with a Retry-After "
     "header.", "What happens if I send too many API requests?"),
    ("Dishwasher error E24 means the drain is blocked: clean the filter at the bottom of the tub.",
     "My dishwasher shows E24, what should I do?"),
    ("Visitors must sign in at reception and wear a badge at all times inside the lab.",
     "What are the rules for guests in the laboratory?"),
    ("Expense claims over 500 euros need approval from a department head before reimbursement.",
     "Who has to approve a large expense report?"),
    ("The warranty covers manufacturing defects for two years but not water damage or cracked screens.",
     "Is a cracked screen covered under warranty?"),
    ("Backups run nightly at 02:00 UTC and are kept for 35 days in a separate region.",
     "How long are backups retained?"),
    ("Basil should be watered when the top centimetre of soil is dry and kept in at least six hours of sun.",
     "How often do I water basil?"),
    ("The gym is open 6:00-22:00 on weekdays and 8:00-18:00 on weekends; towels are available at the desk.",
     "What time does the gym close on Saturday?"),
    ("Passwords must be at least 14 characters and are rotated every 180 days.",
     "What is the minimum password length?"),
    ("Tenants must give two months' written notice before moving out.",
     "How much notice do I need to give before leaving my apartment?"),
    ("The conference room on floor 3 seats 12 people and has a video-call system.",
     "Which meeting room can fit a dozen people?"),
    ("Medication: take one tablet of 5 mg amlodipine each morning with water.",
     "How much amlodipine should I take?"),
    ("For the sourdough, feed the starter 12 hours before baking, using equal weights of flour and water.",
     "When should I feed my starter?"),
    ("Parental leave is 16 weeks at full pay for either parent, taken within the child's first year.",
     "How long is paid parental leave?"),
    ("The museum offers free entry on the first Sunday of every month.",
     "When can I visit the museum without paying?"),
    ("Deploys to production are frozen from December 20 to January 5.",
     "Can we ship to prod during the holidays?"),
    ("The bike's tyres should be inflated to 80-100 psi; check them weekly.",
     "What pressure should my bicycle tires be?"),
    ("Sick leave beyond three days requires a doctor's note sent to HR.",
     "Do I need a medical certificate if I'm ill for a week?"),
    ("The shuttle bus to the airport leaves every 20 minutes from stop B, the first at 5:10.",
     "How often does the airport shuttle run?"),
]

KINDS = {"fact": FACTS, "preference": PREFERENCES, "tool": TOOLS, "knowledge": DOCUMENTS}


def all_items() -> list[Item]:
    """Every memory and its question, by kind.

    Example:
        >>> len(all_items()) > 90
        True
    """
    return [Item(kind, text, question) for kind, pairs in KINDS.items() for text, question in pairs]


def small_stores(*, seed: int, size: int) -> list[list[Item]]:
    """The items shuffled (``seed``) into stores of ``size`` (the last may be smaller): each store mixes kinds and
    topics, so a question's unrelated memories are the others in its store.

    Example:
        >>> [len(s) for s in small_stores(seed=1, size=40)][:2]
        [40, 40]
    """
    items = all_items()
    random.Random(seed).shuffle(items)
    return [items[i:i + size] for i in range(0, len(items), size)]


__all__ = ["Item", "KINDS", "all_items", "small_stores"]
