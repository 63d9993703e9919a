"""Encryption at rest: round trips, wrong key vs tampering, aad binding, key check file."""

from __future__ import annotations

import base64
import json
import os
import pickle
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentmem.errors import AgentMemError, BlobCorruptedError, EncryptionError, InvalidInputError
from agentmem.security.crypto import (
    HEADER_LEN,
    KEYCHECK_FILE,
    TEXT_PREFIX,
    Cipher,
    ScryptParams,
    entry_aad,
    is_encrypted,
    is_encrypted_store,
    parse_raw_key,
    verify_key,
)

# Cheap scrypt for tests; the production default is OWASP's n=2**17.
FAST = ScryptParams(n=2**10, r=8, p=1)
KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


@pytest.fixture()
def cipher() -> Cipher:
    return Cipher(KEY)


# -- round trips ------------------------------------------------------------------------------

@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=4096), st.binary(max_size=64))
def test_round_trip(plaintext: bytes, aad: bytes) -> None:
    c = Cipher(KEY)
    blob = c.encrypt(plaintext, aad=aad)
    assert is_encrypted(blob)
    assert len(blob) == HEADER_LEN + len(plaintext) + 16
    assert c.decrypt(blob, aad=aad) == plaintext


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=500))
def test_text_round_trip(text: str) -> None:
    c = Cipher(KEY)
    token = c.encrypt_text(text, aad=entry_aad("e1", "text"))
    assert token.startswith(TEXT_PREFIX) and token.isascii()
    assert is_encrypted(token)
    assert c.decrypt_text(token, aad=entry_aad("e1", "text")) == text


def test_large_blob_round_trip(cipher: Cipher) -> None:
    data = os.urandom(3 << 20)
    assert cipher.decrypt(cipher.encrypt(data, aad=b"e"), aad=b"e") == data


def test_ciphertext_hides_plaintext(cipher: Cipher) -> None:
    marker = b"MARKER-very-secret-memory" * 4
    assert marker[:16] not in cipher.encrypt(marker, aad=b"e")


def test_nonces_are_unique(cipher: Cipher) -> None:
    blobs = [cipher.encrypt(b"same", aad=b"e") for _ in range(2000)]
    nonces = {b[HEADER_LEN - 12:HEADER_LEN] for b in blobs}
    assert len(nonces) == len(blobs)
    assert len(set(blobs)) == len(blobs)  # same plaintext never gives the same ciphertext


# -- wrong key, tampering, aad ---------------------------------------------------------------

def test_wrong_key_is_an_encryption_error(cipher: Cipher) -> None:
    blob = cipher.encrypt(b"data", aad=b"e1")
    with pytest.raises(EncryptionError, match="different key"):
        Cipher(OTHER).decrypt(blob, aad=b"e1")
    token = cipher.encrypt_text("hi", aad="e1")
    with pytest.raises(EncryptionError):
        Cipher(OTHER).decrypt_text(token, aad="e1")


def test_tampered_ciphertext_is_blob_corrupted(cipher: Cipher) -> None:
    blob = bytearray(cipher.encrypt(b"some kv cache bytes", aad=b"e1"))
    blob[HEADER_LEN + 3] ^= 0x01
    with pytest.raises(BlobCorruptedError):
        cipher.decrypt(bytes(blob), aad=b"e1")


def test_every_single_byte_flip_is_detected(cipher: Cipher) -> None:
    blob = cipher.encrypt(b"0123456789abcdef", aad=b"e1")
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x80
        # The key-id bytes read as "another key's blob"; everything else as corruption.
        expected = EncryptionError if 6 <= i < 14 else BlobCorruptedError
        with pytest.raises(expected):
            cipher.decrypt(bytes(bad), aad=b"e1")


def test_truncation_and_garbage_are_blob_corrupted(cipher: Cipher) -> None:
    blob = cipher.encrypt(b"payload", aad=b"e1")
    for bad in (blob[:-1], blob[:HEADER_LEN], b"", b"PK\x03\x04 not ours at all, long enough!!!!!!!!!"):
        with pytest.raises(BlobCorruptedError):
            cipher.decrypt(bad, aad=b"e1")
    with pytest.raises(BlobCorruptedError):
        cipher.decrypt_text("plain text, not a token", aad="e1")
    with pytest.raises(BlobCorruptedError):
        cipher.decrypt_text(TEXT_PREFIX + "!!!notbase64", aad="e1")


def test_wrong_aad_fails_so_swapped_files_fail(cipher: Cipher, tmp_path: Path) -> None:
    a = cipher.encrypt(b"memory of entry A", aad=entry_aad("A"))
    b = cipher.encrypt(b"memory of entry B", aad=entry_aad("B"))
    (tmp_path / "A.kv").write_bytes(b)  # attacker swaps the two blob files
    (tmp_path / "B.kv").write_bytes(a)
    for name in ("A", "B"):
        with pytest.raises(BlobCorruptedError):
            cipher.decrypt((tmp_path / f"{name}.kv").read_bytes(), aad=entry_aad(name))
    token = cipher.encrypt_text("t", aad=entry_aad("A", "text"))
    with pytest.raises(BlobCorruptedError):
        cipher.decrypt_text(token, aad=entry_aad("A", "summary"))


def test_errors_are_agentmem_errors_and_messages_hold_no_key(cipher: Cipher) -> None:
    with pytest.raises(AgentMemError) as info:
        Cipher(OTHER).decrypt(cipher.encrypt(b"x", aad=b""), aad=b"")
    assert KEY.hex() not in str(info.value) and base64.b64encode(KEY).decode() not in str(info.value)
    assert KEY.hex() not in repr(cipher)


def test_cipher_refuses_pickling(cipher: Cipher) -> None:
    with pytest.raises(TypeError):
        pickle.dumps(cipher)


# -- key material -------------------------------------------------------------------------------

def test_key_parsing() -> None:
    assert parse_raw_key(KEY) == KEY
    assert parse_raw_key(Cipher.format_key(KEY)) == KEY
    assert parse_raw_key("hex:" + KEY.hex()) == KEY
    assert parse_raw_key("correct horse battery staple") is None
    for bad in (b"short", "base64:AAAA", "hex:zz", "base64:!!!"):
        with pytest.raises(InvalidInputError):
            parse_raw_key(bad)
    with pytest.raises(InvalidInputError):
        Cipher(b"x" * 31)
    with pytest.raises(InvalidInputError):
        Cipher.from_secret("a passphrase without a salt")
    with pytest.raises(InvalidInputError):
        Cipher.from_passphrase("", salt=os.urandom(16), params=FAST)


def test_passphrase_depends_on_salt() -> None:
    salt = os.urandom(16)
    a = Cipher.from_passphrase("pw", salt=salt, params=FAST)
    b = Cipher.from_passphrase("pw", salt=salt, params=FAST)
    c = Cipher.from_passphrase("pw", salt=os.urandom(16), params=FAST)
    assert a.key_id == b.key_id != c.key_id
    assert b.decrypt(a.encrypt(b"x", aad=b""), aad=b"") == b"x"


def test_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AGENTMEM_ENCRYPTION_KEY", raising=False)
    with pytest.raises(EncryptionError, match="not set"):
        Cipher.from_env()
    monkeypatch.setenv("AGENTMEM_ENCRYPTION_KEY", Cipher.format_key(KEY))
    assert Cipher.from_env().key_id == Cipher(KEY).key_id
    assert Cipher.from_env(store_dir=tmp_path).key_id == Cipher(KEY).key_id
    assert is_encrypted_store(tmp_path)


# -- store key check ---------------------------------------------------------------------------

def test_store_key_check_created_once_and_verified(tmp_path: Path) -> None:
    store = tmp_path / "store"
    c1 = Cipher.for_store(store, "correct horse battery staple", params=FAST)
    record = json.loads((store / KEYCHECK_FILE).read_text())
    assert record["kdf"]["name"] == "scrypt" and record["kdf"]["n"] == FAST.n
    assert "correct horse" not in (store / KEYCHECK_FILE).read_text()
    assert oct((store / KEYCHECK_FILE).stat().st_mode & 0o777) == "0o600"
    # Reopening derives the same key from the stored salt (params come from the file).
    c2 = Cipher.for_store(store, "correct horse battery staple")
    assert c2.key_id == c1.key_id
    assert c2.decrypt(c1.encrypt(b"kv", aad=b"e"), aad=b"e") == b"kv"
    verify_key(store, "correct horse battery staple")
    c1.verify_key(store)


def test_wrong_key_for_store_raises_and_writes_nothing(tmp_path: Path) -> None:
    Cipher.for_store(tmp_path, KEY)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(EncryptionError, match="wrong encryption key"):
        Cipher.for_store(tmp_path, OTHER)
    with pytest.raises(EncryptionError, match="wrong encryption key"):
        Cipher(OTHER).verify_key(tmp_path)
    with pytest.raises(EncryptionError, match="wrong encryption key"):
        verify_key(tmp_path, "a passphrase instead")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_verify_key_on_unencrypted_or_damaged_store(tmp_path: Path) -> None:
    with pytest.raises(EncryptionError, match="not created with encryption"):
        Cipher(KEY).verify_key(tmp_path)
    assert not is_encrypted_store(tmp_path)
    (tmp_path / KEYCHECK_FILE).write_text("{not json")
    with pytest.raises(EncryptionError, match="unreadable"):
        Cipher(KEY).verify_key(tmp_path)


def test_concurrent_store_creation_agrees_on_one_salt(tmp_path: Path) -> None:
    keys: list[str] = []
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            keys.append(Cipher.for_store(tmp_path, "same passphrase", params=FAST).key_id)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=open_store) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(keys)) == 1  # all derived from the one salt that won the race
    assert [p.name for p in tmp_path.iterdir()] == [KEYCHECK_FILE]  # no tmp files left
