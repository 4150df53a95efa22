"""API keys and the tenants they open, holding only the keys' digests.

A service is configured with a key file: a JSON object from each key's
digest (`sha256:<64 hex digits>`, what `chatledger api-key` prints) to the
tenant the key works in. The keys themselves are never stored, neither in
the file nor in memory: a request's bearer key is hashed and looked up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path

from chatledger.store import InvalidInputError

__all__ = ["KEYS_ENV", "ApiKeys", "key_digest", "new_api_key"]

KEYS_ENV = "CHATLEDGER_API_KEYS"
"""The environment variable that holds the key file's JSON, where no file is given."""

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def key_digest(key: str) -> str:
    """The digest a key file lists for `key`: `sha256:` and 64 lowercase hex digits."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def new_api_key() -> str:
    """A new random API key (256 bits), to hand to a client once."""
    return "clk_" + secrets.token_urlsafe(32)


class ApiKeys:
    """Which tenant each API key opens, by the key's digest."""

    def __init__(self, tenants: Mapping[str, str]) -> None:
        """`tenants` maps digests (`key_digest`) to tenants; each entry is checked."""
        for digest, tenant in tenants.items():
            if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
                raise InvalidInputError(
                    f"API key entry {digest!r} is not a key digest: each key is listed as "
                    f"'sha256:' and 64 lowercase hex digits, as `chatledger api-key` prints it. "
                    f"List digests, never the keys themselves."
                )
            if not isinstance(tenant, str) or not tenant:
                raise InvalidInputError(
                    f"API key {digest[:15]}... opens {tenant!r}: a tenant is a non-empty string."
                )
        self._tenants = dict(tenants)

    @classmethod
    def of(cls, keys: Mapping[str, str]) -> ApiKeys:
        """From keys in clear (key to tenant), e.g. in tests: only their digests are kept."""
        return cls({key_digest(k): t for k, t in keys.items()})

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> ApiKeys:
        """From the key file at `path`, else from the JSON in `$CHATLEDGER_API_KEYS`."""
        if path is not None:
            try:
                text = Path(path).read_text()
            except OSError as error:
                raise InvalidInputError(
                    f"Cannot read the API key file {str(path)!r}: {error.strerror}."
                ) from error
            where = f"The API key file {str(path)!r}"
        elif os.environ.get(KEYS_ENV):
            text, where = os.environ[KEYS_ENV], f"${KEYS_ENV}"
        else:
            raise InvalidInputError(
                f"No API keys: pass a key file (--keys FILE) or set ${KEYS_ENV} to its JSON, "
                f'{{"sha256:<digest>": "<tenant>"}}. `chatledger api-key TENANT` makes a key '
                f"and prints its entry."
            )
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidInputError(f"{where} is not JSON: {error}.") from error
        if not isinstance(data, dict):
            raise InvalidInputError(
                f'{where} must hold a JSON object {{"sha256:<digest>": "<tenant>"}}, '
                f"not a {type(data).__name__}."
            )
        return cls(data)

    def tenant(self, key: str) -> str | None:
        """The tenant `key` opens, or `None` for a key that is not listed."""
        return self._tenants.get(key_digest(key))

    def __len__(self) -> int:
        return len(self._tenants)
