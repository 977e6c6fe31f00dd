"""The HTTP API's request and response bodies, their limits, and how a refused body reads.

Limits (``max_query_chars``, ``max_top_k``, ``max_batch_queries``) come from the server's settings
as the validation context, so one model serves every server; a failed validation becomes one status
and one readable line (``explain``) rather than pydantic's error list.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

DEFAULT_TOP_K = 10
"""Passages for a request that names no ``top_k`` (rLLM's default), or ``max_top_k`` where that is lower."""


def _limits(info: ValidationInfo) -> dict[str, int]:
    return info.context or {}


def _check_query(value: str, info: ValidationInfo) -> str:
    if not value.strip():
        raise PydanticCustomError("empty_query", "must not be empty or whitespace")
    limit = _limits(info).get("max_query_chars", 2048)
    if len(value) > limit:
        raise PydanticCustomError("query_too_long", "is {length} characters long; the limit is {limit}",
                                  {"length": len(value), "limit": limit})
    return value


def _check_top_k(value: int, info: ValidationInfo) -> int:
    limit = _limits(info).get("max_top_k", 100)
    if not 1 <= value <= limit:
        raise PydanticCustomError("top_k_range", "must be between 1 and {limit} (got {value})",
                                  {"limit": limit, "value": value})
    return value


def _check_count(value: list[str], info: ValidationInfo) -> list[str]:
    limit = _limits(info).get("max_batch_queries", 256)
    if not value:
        raise PydanticCustomError("no_queries", "must hold at least one query")
    if len(value) > limit:
        raise PydanticCustomError("too_many_queries", "holds {count} queries; the limit is {limit}",
                                  {"count": len(value), "limit": limit})
    return value


Query = Annotated[StrictStr, AfterValidator(_check_query)]
TopK = Annotated[StrictInt, AfterValidator(_check_top_k)]


class RetrieveRequest(BaseModel):
    """``POST /retrieve`` body; ``k`` (rLLM's name) overrides ``top_k`` when given. Other fields are a 422."""

    model_config = ConfigDict(extra="forbid")

    query: Query
    top_k: TopK = DEFAULT_TOP_K
    k: TopK | None = None

    def passages_wanted(self, default: int) -> int:
        """``k``, else ``top_k`` when the request gave it, else ``default``."""
        if self.k is not None:
            return self.k
        return self.top_k if "top_k" in self.model_fields_set else default


class BatchRetrieveRequest(BaseModel):
    """``POST /batch_retrieve`` body. Other fields are a 422."""

    model_config = ConfigDict(extra="forbid")

    queries: Annotated[list[Query], AfterValidator(_check_count)]
    top_k: TopK = DEFAULT_TOP_K

    def passages_wanted(self, default: int) -> int:
        """``top_k`` when the request gave it, else ``default``."""
        return self.top_k if "top_k" in self.model_fields_set else default


class Passage(BaseModel):
    """One search hit; ``score`` is the inner product (cosine for normalised encoders).

    ``contents`` is the text without its title; ``content`` is the whole text as the corpus holds it
    (wiki-18's quoted title line included), the field rLLM's server and its clients use.
    """

    id: str
    title: str
    contents: str
    content: str
    score: float


class RetrieveResponse(BaseModel):
    """``POST /retrieve`` answer; ``method`` and ``num_results`` as rLLM's server sends them."""

    query: str
    top_k: int
    method: str
    num_results: int
    results: list[Passage]


class BatchRetrieveResponse(BaseModel):
    """``POST /batch_retrieve`` answer: ``results[i]`` answers ``queries[i]``."""

    top_k: int
    results: list[list[Passage]]


def explain(error: ValidationError, model: type[BaseModel]) -> tuple[int, str]:
    """One status and one readable line for a failed validation of a ``model`` body."""
    parts = []
    for e in error.errors(include_url=False):
        if e["type"] == "json_invalid":
            return 400, f"invalid JSON: {e.get('ctx', {}).get('error', e['msg'])}"
        if not e["loc"]:
            return 422, f"request body must be a JSON object ({e['msg']})"
        loc = ".".join(str(part) for part in e["loc"])
        if e["type"] == "extra_forbidden":
            parts.append(f"{loc}: unknown field (the fields are {', '.join(model.model_fields)})")
        else:
            parts.append(f"{loc}: {e['msg']}")
    return 422, "; ".join(parts)


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of a route that reads its body itself, documented as ``model``."""
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}
