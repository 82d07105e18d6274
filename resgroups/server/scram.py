"""The server side of SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL speaks it.

PostgreSQL clients (libpq, so psql and psycopg) send an empty SCRAM user name
(``n=,``: the startup packet already named the user), which the scramp
library refuses as malformed; the exchange is small enough to own. No
channel binding: the server does not speak TLS, so ``p=`` is refused and
``y``/``n`` are accepted.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Final

MECHANISM: Final = "SCRAM-SHA-256"


class ScramFailed(Exception):
    """The exchange failed: a malformed message or a proof that does not match."""


def _attributes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise ScramFailed(f"malformed SCRAM attribute {part[:20]!r}")
        out.setdefault(key, value)
    return out


class ScramServer:
    """One login's exchange against a verifier (salt, StoredKey, ServerKey, iterations)."""

    def __init__(self, verifier: tuple[bytes, bytes, bytes, int]) -> None:
        self.salt, self.stored_key, self.server_key, self.iterations = verifier
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""

    def first(self, client_first: str) -> str:
        """client-first-message -> server-first-message."""
        if client_first.startswith("p="):
            raise ScramFailed("channel binding is not supported (the server has no TLS)")
        if not client_first.startswith(("n,", "y,")):
            raise ScramFailed("malformed SCRAM client-first message")
        flag, sep, rest = client_first[2:].partition(",")
        if not sep or (flag and not flag.startswith("a=")):
            raise ScramFailed("malformed SCRAM GS2 header")
        self._gs2 = client_first[: len(client_first) - len(rest)]
        self._first_bare = rest
        client_nonce = _attributes(rest).get("r", "")
        if not client_nonce:
            raise ScramFailed("SCRAM client-first message without a nonce")
        self._nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
        salt = base64.b64encode(self.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self.iterations}"
        return self._server_first

    def final(self, client_final: str) -> str:
        """client-final-message -> server-final-message; ScramFailed on a bad proof."""
        without_proof, sep, proof_part = client_final.rpartition(",p=")
        if not sep:
            raise ScramFailed("SCRAM client-final message without a proof")
        attrs = _attributes(without_proof)
        if attrs.get("r") != self._nonce:
            raise ScramFailed("SCRAM nonce mismatch")
        if attrs.get("c") != base64.b64encode(self._gs2.encode()).decode():
            raise ScramFailed("SCRAM channel binding mismatch")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise ScramFailed("SCRAM proof is not base64") from None
        message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(self.stored_key, message, "sha256")
        if len(proof) != len(signature):
            raise ScramFailed("SCRAM proof of the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self.stored_key):
            raise ScramFailed("SCRAM proof does not match")
        server_signature = hmac.digest(self.server_key, message, "sha256")
        return "v=" + base64.b64encode(server_signature).decode()
