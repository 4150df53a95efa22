"""Store values as JSON data, for the command line's `--json` output.

`to_json(value, of)` dumps any value the store returns (`Run`,
`list[Verification]`, `Page[Event]`...) with the camelCase aliases its
`__pydantic_config__` gives, so every face prints the same keys.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import TypeAdapter


def to_json(value: Any, of: Any, **options: Any) -> Any:
    """`value`, a value of type `of` (`Run`, `list[Verification]`, `Page[Event]`...), as JSON data.

    The keys are the camelCase aliases the values' `__pydantic_config__`
    gives; `options` go to `TypeAdapter.dump_python` (`exclude=...`).
    """
    return _adapter(of).dump_python(value, mode="json", by_alias=True, **options)


@functools.cache
def _adapter(of: Any) -> TypeAdapter[Any]:
    # Building an adapter compiles a serializer: once per type and process.
    from pydantic import TypeAdapter

    return TypeAdapter(of)
