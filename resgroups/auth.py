"""Password hashes kept in the catalog (never the password itself)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Final

from resgroups.errors import InvalidParameter

_ITERATIONS: Final = 60_000


def encode_password(password: str) -> bytes:
    """UTF-8 bytes of a password; InvalidParameter (never UnicodeEncodeError, and
    never the password itself) when it is not valid text, e.g. a lone surrogate."""
    try:
        return password.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidParameter(
            "a password must be valid UTF-8 text (it holds a lone surrogate)"
        ) from None


_HASH_SHAPE: Final = re.compile(
    r"pbkdf2_sha256\$[1-9][0-9]{0,6}\$(?:[0-9a-f]{2}){1,64}\$[0-9a-f]{64}\Z"
)


def is_password_hash(value: object) -> bool:
    """Is ``value`` a hash :func:`hash_password` could have made (as a catalog
    record must carry)?"""
    return isinstance(value, str) and _HASH_SHAPE.match(value) is not None


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", encode_password(password), salt, _ITERATIONS)
    return f"pbkdf2_sha256${_ITERATIONS}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, iterations, salt_hex, digest_hex = stored.split("$")
    except ValueError:
        return False
    if scheme != "pbkdf2_sha256":
        return False
    try:
        given = password.encode("utf-8")
    except UnicodeEncodeError:  # cannot match; still pay for the hash
        given, digest_hex = b"", ""
    digest = hashlib.pbkdf2_hmac("sha256", given, bytes.fromhex(salt_hex), int(iterations))
    return hmac.compare_digest(digest.hex(), digest_hex)
