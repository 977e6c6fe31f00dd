"""The errors the retrieval service raises, each under the ``rllm.errors`` base that says who is to blame.

* ``RetrievalError`` (``RLLMError``): a search that failed; raised as such for a request the server
  rejected as invalid (the policy's doing: the tool shows it to the model).
* ``RetrievalUnavailableError`` (a ``ToolBackendError``, so an ``InfrastructureError``): the server
  unreachable, timed out, 5xx after the retries, or a garbled answer.
* ``RetrievalAuthError`` (a ``ConfigurationError``): the server refused the client's token.
* ``Overloaded`` (an ``InfrastructureError``): the server's queue is full; answered as 503.
* ``HttpConfigError`` and ``TorchSearchError`` (``ConfigurationError``, and also ``ValueError``):
  an HTTP limit, a metric, devices or vectors that the service cannot take.
* ``EncoderLayoutError`` (``SetupError``, and also ``ValueError``): an encoder folder with a stage
  the encoder does not run (anything but Transformer, Pooling, Normalize).

Only ``rllm.errors`` is imported here, so ``rag.client`` stays light.
"""

from __future__ import annotations

from rllm.errors import ConfigurationError, InfrastructureError, RLLMError, SetupError, ToolBackendError


class RetrievalError(RLLMError):
    """A search that failed; ``str(error)`` is a sentence a person (or a model) can act on.

    Raised as such for a request the server rejected as invalid (a 4xx other than 401/403).
    ``status`` is the HTTP status, when there was one.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RetrievalUnavailableError(RetrievalError, ToolBackendError):
    """The server was unreachable, timed out, answered 5xx after every retry, or sent garbage."""


class RetrievalAuthError(RetrievalError, ConfigurationError):
    """The server refused the client's token (HTTP 401/403): a configuration error, not the policy's."""


class Overloaded(InfrastructureError):
    """The server's queue cannot take the request; it answers 503 with ``Retry-After: retry_after``."""

    def __init__(self, waiting: int, limit: int, retry_after: int) -> None:
        super().__init__(f"retrieval queue is full ({waiting} queries waiting, limit {limit}); "
                         f"retry after {retry_after} s")
        self.retry_after = retry_after


class HttpConfigError(ConfigurationError, ValueError):
    """An HTTP limit outside what the HTTP server accepts."""


class TorchSearchError(ConfigurationError, ValueError):
    """Vectors, devices or a query batch that the torch search cannot take."""


class EncoderLayoutError(SetupError, ValueError):
    """An encoder folder whose stages (``modules.json``) or pooling the encoder does not run."""
