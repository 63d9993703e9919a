"""Security for agentmem: secrets never enter the bank, data at rest is encrypted,
erasures are audited and verifiable.

>>> from agentmem.security import SecretScanner, Cipher, entry_aad
>>> SecretScanner().apply("password=hunter2")
'password=[REDACTED:password]'
>>> c = Cipher(Cipher.generate_key())
>>> c.decrypt(c.encrypt(b"kv", aad=entry_aad("e1")), aad=entry_aad("e1"))
b'kv'

See docs/security.md for the threat model and what is (and is not) protected.
"""

from agentmem.security.audit import AuditLog, SafeLogFilter, entry_summary, install_log_filter
from agentmem.security.crypto import (
    DEFAULT_ENV_VAR,
    KEYCHECK_FILE,
    Cipher,
    ScryptParams,
    entry_aad,
    is_encrypted,
    is_encrypted_store,
    verify_key,
)
from agentmem.security.erase import (
    ScrubReport,
    enable_secure_delete,
    marker_variants,
    scan_tree_for_markers,
    scrub_sqlite,
    secure_rmtree,
    secure_unlink,
)
from agentmem.security.secrets import (
    SECRET_TYPES,
    Finding,
    SecretScanner,
    ValueFinding,
    default_scanner,
    redact,
    scan_text,
    scan_value,
)

__all__ = [
    "DEFAULT_ENV_VAR",
    "KEYCHECK_FILE",
    "SECRET_TYPES",
    "AuditLog",
    "Cipher",
    "Finding",
    "SafeLogFilter",
    "ScrubReport",
    "ScryptParams",
    "SecretScanner",
    "ValueFinding",
    "default_scanner",
    "enable_secure_delete",
    "entry_aad",
    "entry_summary",
    "install_log_filter",
    "is_encrypted",
    "is_encrypted_store",
    "marker_variants",
    "redact",
    "scan_text",
    "scan_tree_for_markers",
    "scan_value",
    "scrub_sqlite",
    "secure_rmtree",
    "secure_unlink",
    "verify_key",
]
