"""One conformance suite for every admission-counter store (:class:`agentmem.ports.admission.AdmissionCounters`):
the in-process one (a server's default) and Redis's (several servers holding one user to one cap), each opened as
the server opens them (:func:`agentmem.admission.open_admission_counters`); then the server's
:class:`~agentmem.server.scheduler.Scheduler` policy on each, two schedulers sharing one store as two servers do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi import HTTPException

from agentmem.admission import AdmissionCounters, Claim, Refusal, open_admission_counters
from agentmem.errors import InvalidInputError
from agentmem.server.scheduler import Scheduler
from agentmem.server.state import ServerSettings

KINDS = ["memory", "redis"]


def _url(kind: str, request: pytest.FixtureRequest) -> str | None:
    return None if kind == "memory" else request.getfixturevalue("fresh_redis_url")


@pytest.fixture(params=KINDS)
def counters(request: pytest.FixtureRequest) -> Iterator[AdmissionCounters]:
    opened = open_admission_counters(_url(request.param, request))
    yield opened
    opened.close()


def test_is_a_counter_store_and_starts_empty(counters: AdmissionCounters) -> None:
    assert isinstance(counters, AdmissionCounters) and counters.held("user:u1") == 0


def test_shares_add_up_to_the_cap_and_the_next_is_refused_with_what_is_held(counters: AdmissionCounters) -> None:
    tokens = Claim("tokens:u1", 300, cap=512)
    assert counters.acquire("t1", [tokens], lease_s=30) is None
    assert counters.acquire("t2", [Claim("tokens:u1", 212, cap=512)], lease_s=30) is None  # exactly at the cap
    assert counters.held("tokens:u1") == 512
    assert counters.acquire("t3", [Claim("tokens:u1", 1, cap=512)], lease_s=30) == Refusal(
        Claim("tokens:u1", 1, cap=512), held=512)
    assert counters.held("tokens:u1") == 512  # the refused ticket took nothing


def test_all_claims_or_none_and_the_first_over_its_cap_is_named(counters: AdmissionCounters) -> None:
    assert counters.acquire("t1", [Claim("user:u1", 1, cap=1)], lease_s=30) is None
    claims = [Claim("key:k1", 1, cap=8), Claim("user:u1", 1, cap=1), Claim("tokens:u1", 10, cap=5)]
    refused = counters.acquire("t2", claims, lease_s=30)
    assert refused == Refusal(claims[1], held=1)  # the user's cap, the first one over, not the tokens'
    assert counters.held("key:k1") == 0 and counters.held("tokens:u1") == 0  # the key's share was not kept either


def test_release_gives_back_every_share_once(counters: AdmissionCounters) -> None:
    claims = [Claim("key:k1", 1, cap=2), Claim("user:u1", 1, cap=2), Claim("tokens:u1", 64, cap=100)]
    assert counters.acquire("t1", claims, lease_s=30) is None
    assert counters.acquire("t2", claims[:2], lease_s=30) is None
    counters.release("t1")
    assert [counters.held(c.name) for c in claims] == [1, 1, 0]
    counters.release("t1")  # released already: nothing changes
    counters.release("never-taken")
    assert [counters.held(c.name) for c in claims] == [1, 1, 0]
    counters.release("t2")
    assert [counters.held(c.name) for c in claims] == [0, 0, 0]


def test_counters_are_separate_by_name(counters: AdmissionCounters) -> None:
    assert counters.acquire("t1", [Claim("user:a", 1, cap=1)], lease_s=30) is None
    assert counters.acquire("t2", [Claim("user:b", 1, cap=1)], lease_s=30) is None  # b is not held back by a
    assert (counters.held("user:a"), counters.held("user:b"), counters.held("user:c")) == (1, 1, 0)


def test_a_lease_not_renewed_ends_and_a_renewed_one_stays(counters: AdmissionCounters) -> None:
    assert counters.acquire("dies", [Claim("user:u1", 1, cap=2)], lease_s=0.3) is None
    assert counters.acquire("lives", [Claim("user:u1", 1, cap=2)], lease_s=0.3) is None
    deadline = time.monotonic() + 0.9
    while time.monotonic() < deadline:
        counters.renew(["lives", "released-already"], lease_s=0.3)
        time.sleep(0.05)
    assert counters.held("user:u1") == 1  # the unrenewed share ended as its holder had died; the renewed one held
    assert counters.acquire("next", [Claim("user:u1", 1, cap=2)], lease_s=30) is None
    assert counters.acquire("over", [Claim("user:u1", 1, cap=2)], lease_s=30) is not None


def test_concurrent_acquires_never_pass_the_cap(counters: AdmissionCounters) -> None:
    with ThreadPoolExecutor(16) as pool:  # 16 requests arriving at once, 3 slots
        refusals = list(pool.map(lambda n: counters.acquire(f"t{n}", [Claim("user:u1", 1, cap=3)], lease_s=30),
                                 range(16)))
    assert refusals.count(None) == 3 and counters.held("user:u1") == 3


def test_an_unknown_url_names_the_setting() -> None:
    with pytest.raises(InvalidInputError, match="limits_url: no backend for 'mysql://x'"):
        open_admission_counters("mysql://x")


# --- the server's policy over each store --------------------------------------------------------------------------

@pytest.fixture(params=KINDS)
def two_servers(request: pytest.FixtureRequest) -> Iterator[tuple[Scheduler, Scheduler]]:
    """Two schedulers over one counter store, as two servers behind a load balancer (in memory: one object)."""
    settings = ServerSettings(max_concurrent_per_user=2, max_concurrent_per_key=3, max_tokens_in_flight_per_user=100,
                              limits_lease_s=30)
    url = _url(request.param, request)
    shared = open_admission_counters(url)
    a = Scheduler(settings, shared)
    b = Scheduler(settings, open_admission_counters(url) if url else shared)
    yield a, b
    a.close()
    b.close()


def test_a_users_cap_holds_across_servers_and_frees_on_release(two_servers) -> None:
    a, b = two_servers
    first = a.admit(key_id="k1", user="u1", max_tokens=10)
    second = b.admit(key_id="k1", user="u1", max_tokens=10)
    with pytest.raises(HTTPException) as exc:
        a.admit(key_id="k1", user="u1", max_tokens=10)
    assert exc.value.status_code == 429 and exc.value.headers == {"Retry-After": "1"}
    assert "user 'u1' already has 2 chat requests in flight (max_concurrent_per_user=2)" in exc.value.detail
    third = b.admit(key_id="k1", user="u2", max_tokens=10)  # another user of the key
    with pytest.raises(HTTPException, match="this API key already has 3 chat requests in flight"):
        a.admit(key_id="k1", user="u3", max_tokens=10)
    with pytest.raises(HTTPException,
                       match="has 10 max_tokens in flight; 95 more would pass max_tokens_in_flight_per_user=100"):
        a.admit(key_id=None, user="u2", max_tokens=95)
    a.release(first)
    assert b.admit(key_id=None, user="u1", max_tokens=10) is not None  # the share A gave back is B's to take
    b.release(second)
    b.release(third)
    assert (a.in_flight, b.in_flight) == (0, 1)


def test_unreachable_counters_answer_503_and_admit_nothing() -> None:
    scheduler = Scheduler(ServerSettings(), open_admission_counters("redis://127.0.0.1:9/0"))  # nothing listens
    try:
        with pytest.raises(HTTPException) as exc:
            scheduler.admit(key_id=None, user="u1", max_tokens=8)
        assert exc.value.status_code == 503 and exc.value.headers == {"Retry-After": "1"}
        assert scheduler.in_flight == 0
    finally:
        scheduler.close()
