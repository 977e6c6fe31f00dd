"""The retrieval service's errors live in ``rag.errors``, each under the ``rllm.errors`` base that says who is to blame."""

from __future__ import annotations

import numpy as np
import pytest

from rag import errors
from rllm.errors import ConfigurationError, InfrastructureError, RLLMError, ToolBackendError

BLAME = [
    # (error, the rllm.errors base it must have, the module that defined it before)
    ("RetrievalError", RLLMError, "rag.client"),
    ("RetrievalUnavailableError", ToolBackendError, "rag.client"),
    ("RetrievalAuthError", ConfigurationError, "rag.client"),
    ("Overloaded", InfrastructureError, "rag.batcher"),
    ("HttpConfigError", ConfigurationError, "rag.serving"),
    ("TorchSearchError", ConfigurationError, "rag.torch_search"),
]


@pytest.mark.parametrize(("name", "base", "old_module"), BLAME, ids=[b[0] for b in BLAME])
def test_each_error_has_its_blame_base_and_its_old_import_path(name: str, base: type, old_module: str) -> None:
    import importlib

    error = getattr(errors, name)
    assert issubclass(error, base) and issubclass(error, RLLMError)
    assert error.__module__ == "rag.errors"
    assert getattr(importlib.import_module(old_module), name) is error  # ``from rag.client import ...`` still works


def test_infrastructure_and_configuration_do_not_mix() -> None:
    assert not issubclass(errors.RetrievalAuthError, InfrastructureError)
    assert not issubclass(errors.RetrievalUnavailableError, ConfigurationError)
    assert not issubclass(errors.Overloaded, ConfigurationError)


def test_every_public_exception_class_of_rag_is_in_rag_errors() -> None:
    import inspect
    import pkgutil

    import rag

    strays = []
    for info in pkgutil.iter_modules(rag.__path__):
        if info.name in {"errors", "testing"}:
            continue
        module = __import__(f"rag.{info.name}", fromlist=["_"])
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and not name.startswith("_")
                    and value.__module__ == module.__name__):
                strays.append(f"{module.__name__}.{name}")
    assert not strays, f"public exceptions defined outside rag/errors.py: {strays}"


def test_bad_settings_raise_configuration_errors_that_are_still_value_errors() -> None:
    from rag.serving import HttpLimits

    with pytest.raises(ConfigurationError, match="max_header_bytes must be at least 8192"):
        HttpLimits(max_header_bytes=100).check()
    pytest.importorskip("torch")
    from rag.torch_search import TorchFlatIndex

    with pytest.raises(ValueError, match="metric must be 'ip' or 'l2'") as info:
        TorchFlatIndex(np.zeros((4, 8), dtype=np.float32), metric="cosine")  # type: ignore[arg-type]
    assert isinstance(info.value, ConfigurationError)
