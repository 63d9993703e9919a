"""``mem.stored_vectors``: the vectors the index holds for a user's entries, the public path an erasure audit (and
benchmarks/erasure.py) uses to know which bytes must be gone from the store's files after ``forget``."""

from __future__ import annotations

import numpy as np
import pytest

from agentmem import AgentMemory, InvalidInputError
from agentmem.security import scan_tree_for_markers

# the facade on the SQLite file and on the in-process catalog written against the port alone (tests/conftest.py)
pytestmark = pytest.mark.catalogs(None, "memory")


def test_stored_vectors_are_the_users_own_and_go_with_forget(mem: AgentMemory) -> None:
    oslo = mem.remember("I moved to Oslo in May.", user_id="u1")
    dog = mem.remember("My dog is called Rex.", user_id="u1")
    theirs = mem.remember("I moved to Lyon in June.", user_id="u2")

    got = mem.stored_vectors([oslo.id, dog.id, theirs.id], user_id="u1")
    assert sorted(got) == sorted([oslo.id, dog.id])  # another user's entry is never reachable
    assert all(v.dtype == np.float32 and v.ndim == 1 for v in got.values())
    assert not np.array_equal(got[oslo.id], got[dog.id])
    assert all(np.linalg.norm(v) == pytest.approx(1.0, abs=1e-4) for v in got.values())  # unit: cosine space

    prefix = got[oslo.id][:8].tobytes()  # what an attacker reading the files would look for
    # Whether embedded Chroma has written these exact bytes to its files yet depends on when it flushes (seen both
    # ways in one suite run), so the file check applies when they were there; tests/unit/test_hardening_erasure.py
    # plants vectors until they are on disk and checks their erasure without this caveat.
    on_disk = bool(scan_tree_for_markers(mem.path, [prefix]))
    assert mem.forget(oslo.id) == 1
    assert mem.stored_vectors([oslo.id, dog.id], user_id="u1").keys() == {dog.id}
    if on_disk:
        assert scan_tree_for_markers(mem.path, [prefix]) == {}


@pytest.mark.parametrize("ids, user_id, named", [
    ("6c35237b-5975-4064-8467-f8d115fe42ee", "u1", "entry_ids must be a list"),  # one id, not a list of them
    ([7], "u1", r"entry_ids\[0\]"),
    ([], "", "user_id"),
    ([], None, "user_id"),
])
def test_stored_vectors_bad_input_is_a_typed_error(mem: AgentMemory, ids: object, user_id: object, named: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        mem.stored_vectors(ids, user_id=user_id)  # type: ignore[arg-type]
