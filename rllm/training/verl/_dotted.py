"""Objects named by dotted paths in the recipe (tool factories, scorers, exception classes)."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(path: str) -> Any:
    """The object named ``module:attr`` or ``module.attr``."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"'{path}' is not a dotted path like 'package.module:name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import '{path}': {error}") from error
