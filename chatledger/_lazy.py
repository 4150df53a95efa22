"""Names imported on first use (PEP 562), for `store/__init__.py` and `engine/__init__.py`.

`chatledger/__init__.py` keeps its own five shortcuts: `import chatledger`
loads no module of the package.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    namespace: dict[str, Any], lazy: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of the package whose globals are `namespace`.

    Args:
        namespace: the package's `globals()`; a loaded name is stored there.
        lazy: each public name, and the module it comes from, relative to the
            package. Any other public name that is a submodule (as
            `engine.providers`) is imported as one.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = lazy.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module, package), name)
        elif not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # once loaded, a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(lazy))

    return __getattr__, __dir__
