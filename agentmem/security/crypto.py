"""Encryption at rest: AES-256-GCM blobs and text tokens, one key check per store.

Blob layout (``HEADER_LEN`` = 26 bytes, then ciphertext and the 16-byte GCM tag)::

    magic b"AMEB" | version u8 | algorithm u8 | key id (8 bytes) | nonce (12 bytes)

The whole header is authenticated together with the caller's ``aad`` (an entry id), so a
blob copied onto another entry, a downgraded header or a flipped bit all fail to decrypt.
The key id (a one-way HKDF output, not the key) lets a wrong key be told apart from
tampering: wrong key -> :class:`EncryptionError`, bad data -> :class:`BlobCorruptedError`.

Keys: 32 raw bytes, or a passphrase stretched with scrypt (OWASP's n=2**17, r=8, p=1) under
a random per-store salt kept in ``<store>/encryption.json`` with the key check. Strings
``"base64:<...>"`` / ``"hex:<...>"`` denote raw keys; any other string is a passphrase.

>>> c = Cipher(bytes(range(32)))
>>> blob = c.encrypt(b"kv bytes", aad=b"entry-1")
>>> c.decrypt(blob, aad=b"entry-1")
b'kv bytes'
>>> c.decrypt_text(c.encrypt_text("hello", aad="entry-1:text"), aad="entry-1:text")
'hello'
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from agentmem.errors import BlobCorruptedError, EncryptionError, InvalidInputError

from agentmem._fs import atomic_create

MAGIC = b"AMEB"
VERSION = 1
ALG_AES256_GCM = 1
_HEADER = struct.Struct(">4sBB8s12s")
HEADER_LEN = _HEADER.size  # 26
TAG_LEN = 16
TEXT_PREFIX = "amenc1:"  # versioned so a future format can coexist in the same column
KEY_LEN = 32
KEYCHECK_FILE = "encryption.json"
DEFAULT_ENV_VAR = "AGENTMEM_ENCRYPTION_KEY"
_KEYCHECK_PLAINTEXT = b"agentmem key check v1"
_KEYCHECK_AAD = b"agentmem:keycheck"

KeyMaterial = bytes | bytearray | str


@dataclass(frozen=True, slots=True)
class ScryptParams:
    """scrypt cost; the defaults follow OWASP (~128 MiB, ~0.5 s). Stored per store, so
    raising them later only affects new stores."""

    n: int = 2**17
    r: int = 8
    p: int = 1


class Cipher:
    """AES-256-GCM with a versioned, authenticated header; holds the key, never prints it.

    >>> c = Cipher.from_secret("base64:" + base64.b64encode(bytes(32)).decode())
    >>> repr(c).startswith("Cipher(key_id=")
    True
    """

    __slots__ = ("_aead", "_key_id", "_index_key", "kdf")

    def __init__(self, key: bytes | bytearray, *, kdf: dict | None = None) -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_LEN:
            raise InvalidInputError(f"an encryption key must be exactly {KEY_LEN} bytes")
        key = bytes(key)
        self._aead = AESGCM(key)
        # A fingerprint for headers and the key check: HKDF is one-way, so it reveals nothing
        # usable about the key, and a separate info string keeps it independent of the cipher.
        self._key_id = HKDF(hashes.SHA256(), 8, salt=None, info=b"agentmem key id v1").derive(key)
        # A separate one-way subkey for the blind lexical index (agentmem.security.blind).
        self._index_key = HKDF(hashes.SHA256(), 32, salt=None, info=b"agentmem blind index v1").derive(key)
        self.kdf = kdf or {"name": "raw"}  # how the key was made; recorded in the key check

    # -- construction ---------------------------------------------------------------------

    @staticmethod
    def generate_key() -> bytes:
        """32 random bytes from the OS CSPRNG."""
        return os.urandom(KEY_LEN)

    @staticmethod
    def format_key(key: bytes) -> str:
        """A raw key as the ``"base64:..."`` string accepted by env vars and :meth:`from_secret`."""
        return "base64:" + base64.b64encode(key).decode("ascii")

    @classmethod
    def from_passphrase(cls, passphrase: str, *, salt: bytes, params: ScryptParams = ScryptParams()) -> Cipher:
        """Stretch a passphrase with scrypt; ``salt`` must be the store's (16+ random bytes)."""
        if not isinstance(passphrase, str) or not passphrase:
            raise InvalidInputError("the encryption passphrase must be a non-empty string")
        if len(salt) < 16:
            raise InvalidInputError("the scrypt salt must be at least 16 bytes")
        key = Scrypt(salt=salt, length=KEY_LEN, n=params.n, r=params.r, p=params.p).derive(passphrase.encode("utf-8"))
        kdf = {"name": "scrypt", "salt": _b64(salt), "n": params.n, "r": params.r, "p": params.p}
        return cls(key, kdf=kdf)

    @classmethod
    def from_secret(cls, secret: KeyMaterial, *, salt: bytes | None = None,
                    params: ScryptParams = ScryptParams()) -> Cipher:
        """Raw bytes, a ``base64:``/``hex:`` string, or a passphrase (needs ``salt``)."""
        raw = parse_raw_key(secret)
        if raw is not None:
            return cls(raw)
        if salt is None:
            raise InvalidInputError("a passphrase needs the store's salt: use Cipher.for_store(store_dir, ...)")
        return cls.from_passphrase(str(secret), salt=salt, params=params)

    @classmethod
    def for_store(cls, store_dir: str | os.PathLike[str], secret: KeyMaterial, *,
                  params: ScryptParams = ScryptParams()) -> Cipher:
        """The cipher for a store: verified against its key check, which is created (with a
        fresh salt) on first use. Raises :class:`EncryptionError` for a wrong key.

        ``params`` only matters when the store is new; an existing store uses its own.
        """
        store = Path(store_dir)
        path = store / KEYCHECK_FILE
        if not path.exists():
            store.mkdir(parents=True, exist_ok=True)
            if parse_raw_key(secret) is not None:
                cipher = cls.from_secret(secret)
            else:
                cipher = cls.from_passphrase(str(secret), salt=os.urandom(16), params=params)
            if atomic_create(path, cipher._keycheck_record()):
                return cipher
            # Another process created the store first: fall through and verify against its.
        record = _read_keycheck(path)
        cipher = cls._for_record(record, secret)
        cipher._check(record)
        return cipher

    @classmethod
    def from_env(cls, var: str = DEFAULT_ENV_VAR, *, store_dir: str | os.PathLike[str] | None = None) -> Cipher:
        """Key from an environment variable; with ``store_dir`` it is checked against the store.

        >>> os.environ["AGENTMEM_DOCTEST_KEY"] = Cipher.format_key(bytes(32))
        >>> Cipher.from_env("AGENTMEM_DOCTEST_KEY").encrypt(b"x", aad=b"") != b"x"
        True
        """
        value = os.environ.get(var)
        if not value:
            raise EncryptionError(f"environment variable {var} is not set or empty")
        if store_dir is not None:
            return cls.for_store(store_dir, value)
        return cls.from_secret(value)

    @classmethod
    def _for_record(cls, record: dict, secret: KeyMaterial) -> Cipher:
        kdf = record.get("kdf") or {}
        raw = parse_raw_key(secret)
        if kdf.get("name") == "raw":
            if raw is None:
                raise EncryptionError("wrong encryption key for this store: it was created with a raw key, "
                                      "got a passphrase")
            return cls(raw)
        if kdf.get("name") == "scrypt":
            if raw is not None:
                raise EncryptionError("wrong encryption key for this store: it was created with a passphrase, "
                                      "got a raw key")
            try:
                salt = base64.b64decode(kdf["salt"], validate=True)
                params = ScryptParams(int(kdf["n"]), int(kdf["r"]), int(kdf["p"]))
            except (KeyError, ValueError, TypeError, binascii.Error) as e:
                raise EncryptionError(f"unreadable key check file ({KEYCHECK_FILE}): bad kdf fields") from e
            return cls.from_passphrase(str(secret), salt=salt, params=params)
        raise EncryptionError(f"unreadable key check file ({KEYCHECK_FILE}): unknown kdf {kdf.get('name')!r}")

    # -- key check --------------------------------------------------------------------------

    def verify_key(self, store_dir: str | os.PathLike[str]) -> None:
        """Raise :class:`EncryptionError` unless this key opens ``store_dir``; writes nothing."""
        self._check(_read_keycheck(Path(store_dir) / KEYCHECK_FILE))

    def _check(self, record: dict) -> None:
        try:
            check = base64.b64decode(record["check"], validate=True)
        except (KeyError, TypeError, ValueError, binascii.Error) as e:
            raise EncryptionError(f"unreadable key check file ({KEYCHECK_FILE})") from e
        try:
            ok = self.decrypt(check, aad=_KEYCHECK_AAD) == _KEYCHECK_PLAINTEXT
        except (BlobCorruptedError, EncryptionError):
            ok = False
        if not ok:
            raise EncryptionError(
                "wrong encryption key for this store (the key check did not verify); "
                "nothing was read or written"
            )

    def _keycheck_record(self) -> bytes:
        record = {
            "format": "agentmem-keycheck",
            "version": VERSION,
            "algorithm": "AES-256-GCM",
            "kdf": self.kdf,
            "key_id": self._key_id.hex(),
            "check": _b64(self.encrypt(_KEYCHECK_PLAINTEXT, aad=_KEYCHECK_AAD)),
        }
        return (json.dumps(record, indent=2) + "\n").encode("utf-8")

    # -- bytes --------------------------------------------------------------------------------

    @property
    def index_key(self) -> bytes:
        """Subkey for keyed hashing of index terms; reveals nothing about the encryption key."""
        return self._index_key

    @property
    def key_id(self) -> str:
        """Hex fingerprint of the key (safe to log): tells keys apart, reveals nothing."""
        return self._key_id.hex()

    def encrypt(self, plaintext: bytes, *, aad: bytes | str) -> bytes:
        """Encrypt with a fresh random 96-bit nonce; ``aad`` binds the blob to its owner.

        Random nonces are safe for ~2**32 messages per key, far beyond a memory store.
        """
        if not isinstance(plaintext, (bytes, bytearray, memoryview)):
            raise InvalidInputError(f"encrypt expects bytes, got {type(plaintext).__name__}")
        header = _HEADER.pack(MAGIC, VERSION, ALG_AES256_GCM, self._key_id, os.urandom(12))
        return header + self._aead.encrypt(header[-12:], bytes(plaintext), header + _aad(aad))

    def decrypt(self, blob: bytes, *, aad: bytes | str) -> bytes:
        """Decrypt and authenticate; :class:`EncryptionError` for another key's blob,
        :class:`BlobCorruptedError` for anything truncated, altered or bound to another aad."""
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise InvalidInputError(f"decrypt expects bytes, got {type(blob).__name__}")
        blob = bytes(blob)
        if len(blob) < HEADER_LEN + TAG_LEN:
            raise BlobCorruptedError(f"encrypted blob is truncated ({len(blob)} bytes)")
        magic, version, alg, key_id, nonce = _HEADER.unpack_from(blob)
        if magic != MAGIC:
            raise BlobCorruptedError("not an agentmem encrypted blob (bad magic)")
        if version != VERSION or alg != ALG_AES256_GCM:
            raise BlobCorruptedError(f"unsupported encrypted blob version {version}/algorithm {alg}")
        if not hmac.compare_digest(key_id, self._key_id):
            raise EncryptionError(
                f"blob was encrypted with a different key (key id {key_id.hex()}, this key {self.key_id})"
            )
        try:
            return self._aead.decrypt(nonce, blob[HEADER_LEN:], blob[:HEADER_LEN] + _aad(aad))
        except InvalidTag:
            raise BlobCorruptedError(
                "encrypted blob failed authentication: altered, truncated, or bound to another entry"
            ) from None

    # -- text columns ---------------------------------------------------------------------------

    def encrypt_text(self, text: str, *, aad: bytes | str) -> str:
        """A printable token (``amenc1:`` + base64url) for a SQLite text column."""
        if not isinstance(text, str):
            raise InvalidInputError(f"encrypt_text expects str, got {type(text).__name__}")
        blob = self.encrypt(text.encode("utf-8"), aad=aad)
        return TEXT_PREFIX + base64.urlsafe_b64encode(blob).decode("ascii")

    def decrypt_text(self, token: str, *, aad: bytes | str) -> str:
        """Inverse of :meth:`encrypt_text`; a value that is not a token is corrupt data."""
        if not isinstance(token, str) or not token.startswith(TEXT_PREFIX):
            raise BlobCorruptedError("value is not an agentmem encrypted text token")
        try:
            blob = base64.urlsafe_b64decode(token[len(TEXT_PREFIX):].encode("ascii"))
        except (ValueError, binascii.Error) as e:
            raise BlobCorruptedError("encrypted text token is not valid base64") from e
        try:
            return self.decrypt(blob, aad=aad).decode("utf-8")
        except UnicodeDecodeError as e:  # authenticated, so only a writer bug gets here
            raise BlobCorruptedError("decrypted text is not UTF-8") from e

    def __repr__(self) -> str:
        return f"Cipher(key_id={self.key_id!r})"

    def __reduce__(self) -> tuple:
        # Pickling would copy the key into whatever the pickle lands in (queues, caches, disk).
        raise TypeError("Cipher holds a key and cannot be pickled; rebuild it from the key source")


# -- helpers -----------------------------------------------------------------------------------

def parse_raw_key(secret: KeyMaterial) -> bytes | None:
    """32 raw bytes from bytes or a ``base64:``/``hex:`` string; None for a passphrase."""
    if isinstance(secret, (bytes, bytearray)):
        if len(secret) != KEY_LEN:
            raise InvalidInputError(f"a raw encryption key must be exactly {KEY_LEN} bytes, got {len(secret)}")
        return bytes(secret)
    if not isinstance(secret, str):
        raise InvalidInputError(f"an encryption key is bytes or str, got {type(secret).__name__}")
    for prefix, decode in (("base64:", lambda s: base64.b64decode(s, validate=True)), ("hex:", bytes.fromhex)):
        if secret.startswith(prefix):
            try:
                raw = decode(secret[len(prefix):].strip())
            except (ValueError, binascii.Error):
                raise InvalidInputError(f"the {prefix[:-1]} encryption key does not decode") from None
            if len(raw) != KEY_LEN:
                raise InvalidInputError(f"a raw encryption key must be exactly {KEY_LEN} bytes, got {len(raw)}")
            return raw
    return None


def is_encrypted(value: bytes | bytearray | memoryview | str) -> bool:
    """True for an agentmem encrypted blob or text token (by format; not authenticated).

    >>> is_encrypted(b"plain safetensors bytes"), is_encrypted("amenc1:AAAA")
    (False, True)
    """
    if isinstance(value, str):
        return value.startswith(TEXT_PREFIX)
    return len(value) >= HEADER_LEN + TAG_LEN and bytes(value[:4]) == MAGIC


def is_encrypted_store(store_dir: str | os.PathLike[str]) -> bool:
    """True when ``store_dir`` has a key check, i.e. was created with encryption on."""
    return (Path(store_dir) / KEYCHECK_FILE).is_file()


def verify_key(store_dir: str | os.PathLike[str], secret: KeyMaterial) -> Cipher:
    """Open-time check without creating anything: the store's cipher, or :class:`EncryptionError`."""
    record = _read_keycheck(Path(store_dir) / KEYCHECK_FILE)
    cipher = Cipher._for_record(record, secret)
    cipher._check(record)
    return cipher


def entry_aad(entry_id: str, field: str = "kv") -> bytes:
    """The AAD binding a value to one field of one entry (use the same on read and write).

    >>> entry_aad("e1"), entry_aad("e1", "text")
    (b'agentmem:kv:e1', b'agentmem:text:e1')
    """
    if not entry_id or not field or ":" in field:
        raise InvalidInputError("entry_aad needs a non-empty entry id and a field name without ':'")
    return f"agentmem:{field}:{entry_id}".encode("utf-8")


def _aad(aad: bytes | str) -> bytes:
    if isinstance(aad, str):
        return aad.encode("utf-8")
    if isinstance(aad, (bytes, bytearray, memoryview)):
        return bytes(aad)
    raise InvalidInputError(f"aad must be bytes or str, got {type(aad).__name__}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _read_keycheck(path: Path) -> dict:
    try:
        record = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise EncryptionError(f"no key check at {path}: the store was not created with encryption") from None
    except (OSError, ValueError) as e:
        raise EncryptionError(f"unreadable key check file {path}") from e
    if not isinstance(record, dict) or record.get("format") != "agentmem-keycheck":
        raise EncryptionError(f"unreadable key check file {path}")
    if record.get("version") != VERSION:
        raise EncryptionError(f"key check version {record.get('version')!r} is not supported")
    return record


__all__ = [
    "DEFAULT_ENV_VAR",
    "HEADER_LEN",
    "KEYCHECK_FILE",
    "TEXT_PREFIX",
    "Cipher",
    "ScryptParams",
    "entry_aad",
    "is_encrypted",
    "is_encrypted_store",
    "parse_raw_key",
    "verify_key",
]
