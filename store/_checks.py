"""The checks every value a caller passes goes through, before any transaction.

One home for each rule, so both backends (and both faces) answer the same
input the same way: SQLite would silently store a 300-character model name
in a 200-character column, and Postgres would refuse it with a driver error
that reads like a fault. Every check raises `InvalidInputError` naming the
argument and saying what to pass instead; nothing is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

from chatledger.store._errors import InvalidInputError
from chatledger.store.ids import is_id

__all__ = [
    "MAX_INT32",
    "MAX_INT64",
    "MAX_JSON_DEPTH",
    "check_choice",
    "check_encodable",
    "check_id",
    "check_int",
    "check_limit",
    "check_long_text",
    "check_new_id",
    "check_seconds",
    "check_text",
    "json_text",
]

MAX_INT32 = 2**31 - 1
"""The largest position or count the tables hold (SQL INTEGER)."""
MAX_INT64 = 2**63 - 1
"""The largest `seq` the tables hold (SQL BIGINT)."""
MAX_JSON_DEPTH = 200
"""How deeply metadata, payloads and tool arguments may nest: far beyond any
real document, and well inside the recursion limits of every JSON parser
that reads them back (Python's, Postgres's `::json`)."""


def check_id(value: object, kind: str) -> str:
    """`value` if it is a canonical UUID (lowercase, hyphenated), else `InvalidInputError`."""
    # A malformed id would make Postgres' uuid cast fail with a driver error,
    # and a differently spelled one would match on Postgres but not on SQLite:
    # only the canonical form is accepted, the same way on both.
    if not isinstance(value, str) or not is_id(value):
        raise InvalidInputError(
            f"{kind.capitalize()} id {value!r} is not a UUID in canonical form (lowercase, "
            f"hyphenated). Pass the id exactly as chatledger returned it."
        )
    return value


def check_new_id(value: object, kind: str) -> str | None:
    """An id the caller chooses for a new object: None (chatledger mints one) or canonical.

    An empty string is refused, not taken to mean "mint one": a caller that
    passes "" has lost an id somewhere, and a new one would hide that.
    """
    return None if value is None else check_id(value, kind)


def check_text(value: object, what: str, *, max_chars: int = 200) -> str:
    """Refuse text that cannot be stored: empty, too long, NUL or lone surrogates."""
    if not isinstance(value, str) or not value or len(value) > max_chars or "\x00" in value:
        raise InvalidInputError(
            f"The {what} {value!r} is not usable: it must be a string of 1 to {max_chars} "
            f"characters with no NUL character. Pass a short, printable {what}."
        )
    check_encodable(value, what)
    return value


def check_long_text(value: object, what: str, *, max_chars: int) -> str:
    """Free text (an error, a note): a string of at most `max_chars`, no NUL, valid Unicode."""
    if not isinstance(value, str) or len(value) > max_chars or "\x00" in value:
        raise InvalidInputError(
            f"The {what} must be a string of at most {max_chars:,} characters with no NUL "
            f"character, not {value!r:.80}."
        )
    check_encodable(value, what)
    return value


def check_encodable(text: str, what: str) -> None:
    """Refuse text with lone surrogates: it cannot be encoded as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"The {what} contains text that is not valid Unicode ({exc.reason}); nothing was "
            f"written. Decode it with errors='replace' before passing it."
        ) from exc


def check_int(value: object, what: str, *, minimum: int, maximum: int) -> int:
    """`value` if it is an int (not a bool, not a string) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidInputError(
            f"{what} must be a whole number from {minimum:,} to {maximum:,}, not {value!r}."
        )
    return value


def check_limit(value: object, what: str = "limit") -> int:
    """A row count a caller asks for: 1 to `MAX_INT32`."""
    return check_int(value, what, minimum=1, maximum=MAX_INT32)


def check_seconds(value: object, what: str) -> float:
    """A lease duration in seconds: finite, at most a year either way.

    Zero or less is allowed: such a lease has already expired, which is how a
    test (or an operator) hands a run to the resume workers at once.
    """
    year = 366 * 24 * 3600
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not -year <= value <= year
    ):
        raise InvalidInputError(
            f"{what} must be a finite number of seconds from -{year:,} to {year:,}, not {value!r}."
        )
    return float(value)


def check_choice(value: object, what: str, choices: Collection[str]) -> str:
    """`value` if it is one of `choices`."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidInputError(
            f"{what} must be one of {', '.join(sorted(choices))}, not {value!r}."
        )
    return value


def json_text(value: Any, what: str, *, sort_keys: bool = True) -> str:
    """`value` as compact JSON text, or `InvalidInputError` when it is not plain JSON.

    Plain JSON is what reads back equal: dicts with string keys, lists,
    strings, finite numbers, booleans and None, nested at most
    `MAX_JSON_DEPTH` deep. A set, bytes, a datetime, a tuple, a non-string
    key, NaN or Infinity would be refused by `json.dumps`, turned into
    something else (a tuple into a list, `1` into `"1"`), or stored as a
    token no JSON parser accepts; each is refused here, naming where it is.
    """
    if not _plain(value):
        _check_plain(value, what)  # refuses it, naming where, or accepts subclasses
    text = json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys, allow_nan=False
    )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _check_plain(value, what)  # a lone surrogate somewhere: names where
        raise
    return text


def _plain(root: Any) -> bool:
    """Whether `root` is plain JSON of the exact built-in types, and no deeper than
    `MAX_JSON_DEPTH`: the common case, checked without naming where. False sends
    the value to `_check_plain`, which accepts subclasses or says what is wrong."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is dict or kind is list:
            if depth >= MAX_JSON_DEPTH and value:
                return False
            if kind is dict:
                if any(type(key) is not str for key in value):
                    return False
                value = value.values()
            for item in value:
                t = type(item)
                if not (t is str or t is int or t is bool or item is None):
                    stack.append((item, depth + 1))  # a container, a float or not JSON
        elif kind is float:
            if not math.isfinite(value):
                return False
        elif not (kind is str or kind is int or kind is bool or value is None):
            return False
    return True


def _check_plain(root: Any, what: str) -> None:
    # Iterative, so a 10,000-deep document is refused with a sentence, not a
    # RecursionError from the walk itself.
    stack: list[tuple[Any, str, int]] = [(root, what, 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidInputError(
                f"{what} nests deeper than {MAX_JSON_DEPTH} levels. Flatten it; nothing was "
                f"written."
            )
        if value is None or isinstance(value, bool | str):
            if isinstance(value, str):
                check_encodable(value, where)
            continue
        if isinstance(value, int):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _not_finite(where, value)
            continue
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InvalidInputError(
                        f"{where} has the key {key!r} of type {type(key).__name__}; JSON keys "
                        f"are strings. Convert the key to a string before passing it."
                    )
                check_encodable(key, f"a key of {where}")
                stack.append((item, f"{where}[{key!r}]", depth + 1))
            continue
        if isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
            continue
        raise InvalidInputError(
            f"{where} is a {type(value).__name__} ({value!r:.60}), which is not JSON. Pass "
            f"dicts with string keys, lists, strings, finite numbers, booleans or None."
        )


def check_finite(value: Any, where: str) -> None:
    """Refuse a NaN or an infinity anywhere in `value` (dicts, lists and tuples walked),
    naming where it is, as `json_text` refuses it: serialized, pydantic would write
    `null` in its place, silently. Everything else is left to the serializer."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise _not_finite(at, item)
        elif isinstance(item, dict):
            stack.extend((v, f"{at}[{k!r}]") for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))


def _not_finite(where: str, value: float) -> InvalidInputError:
    return InvalidInputError(
        f"{where} is {value!r}, which JSON cannot hold (no parser reads NaN or Infinity "
        f"back). Store a finite number, a string or null instead."
    )
