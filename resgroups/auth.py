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


def scram_keys(stored: str) -> tuple[bytes, bytes, bytes, int]:
    """SCRAM-SHA-256 verifier (salt, StoredKey, ServerKey, iterations) of a stored
    hash: its PBKDF2-HMAC-SHA256 digest is exactly SCRAM's SaltedPassword
    (RFC 5802 Hi()), so a SCRAM client proves the password without sending it.
    (SCRAM clients normalise the password with SASLprep first: a password
    that SASLprep changes, e.g. one with non-NFKC characters, logs in over
    the wire only with cleartext authentication.)"""
    scheme, iterations, salt_hex, digest_hex = stored.split("$")
    if scheme != "pbkdf2_sha256":
        raise ValueError(f"not a pbkdf2_sha256 hash: {scheme}")
    salted = bytes.fromhex(digest_hex)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return bytes.fromhex(salt_hex), stored_key, server_key, int(iterations)


_MD5_SHAPE: Final = re.compile(r"md5[0-9a-f]{32}\Z")


def md5_verifier(password: str, name: str) -> str:
    """PostgreSQL's md5 password verifier: ``"md5" + md5(password + name)``. It is
    password-equivalent for an md5 login, so it is kept only when asked for."""
    digest = hashlib.md5(encode_password(password) + name.encode("utf-8"), usedforsecurity=False)
    return "md5" + digest.hexdigest()


def is_md5_verifier(value: object) -> bool:
    return isinstance(value, str) and _MD5_SHAPE.match(value) is not None


def md5_response(verifier: str, salt: bytes) -> str:
    """What an md5 login must send for ``verifier`` and the server's ``salt``."""
    inner = verifier[3:].encode("ascii") + salt
    return "md5" + hashlib.md5(inner, usedforsecurity=False).hexdigest()
