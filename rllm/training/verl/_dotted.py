"""Objects named in the recipe: ``module:name`` (tool factories, scorers, exception classes), or ``file.pkl:name``.

``AgentTrainer`` hands the Python objects it was given (a factory or reward defined in a script's
``__main__``, a ``Budget``) to every verl worker as one cloudpickle file in the run's directory,
named ``/run/dir/workflow.pkl:agent_factory``; every worker reads the file once.
"""

from __future__ import annotations

import functools
import importlib
import pickle
from pathlib import Path
from typing import Any

from rllm.errors import ConfigurationError

PICKLE_SUFFIX = ".pkl"
"""A path whose module part ends with this names an entry of a pickled mapping, not a module."""


def import_object(path: str) -> Any:
    """The object named ``module:attr``, ``module.attr`` or ``file.pkl:key``."""
    module_name, sep, attr = path.partition(":")
    if sep and module_name.endswith(PICKLE_SUFFIX):
        objects = _pickled(module_name, Path(module_name).stat().st_mtime_ns if Path(module_name).exists() else 0)
        if attr not in objects:
            raise ImportError(f"cannot import '{path}': {module_name} holds {sorted(objects)}")
        return objects[attr]
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigurationError(f"'{path}' is not a dotted path like 'package.module:name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ImportError(f"cannot import '{path}': {error}") from error


@functools.lru_cache(maxsize=4)
def _pickled(path: str, mtime_ns: int) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            objects = pickle.load(handle)  # noqa: S301 - the run's own file, written by AgentTrainer
    except FileNotFoundError:
        raise ImportError(f"cannot import from '{path}': no such file (AgentTrainer writes it into the run's "
                          "directory, which every worker must see)") from None
    except Exception as error:  # a class or module the pickle names that this worker cannot import
        raise ImportError(f"cannot load '{path}': {type(error).__name__}: {error}") from error
    if not isinstance(objects, dict):
        raise ImportError(f"'{path}' holds a {type(objects).__name__}, not the mapping AgentTrainer writes")
    return objects
