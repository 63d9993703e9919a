"""Security helpers: secret scanning, encryption at rest, audit logging, verified erasure."""

from agentmem.security.secrets import (
    SECRET_TYPES,
    Finding,
    SecretScanner,
    ValueFinding,
    redact,
    scan_text,
    scan_value,
)

__all__ = [
    "SECRET_TYPES",
    "Finding",
    "SecretScanner",
    "ValueFinding",
    "redact",
    "scan_text",
    "scan_value",
]
