r"""Reading tool-call argument values: strict JSON, and text by the JSON type the tool declares.

Qwen3-Coder writes every argument as bare text (``<parameter=key>\n12345\n</parameter>``), so
the string ``"12345"`` and the integer 12345 look alike. As vLLM's and SGLang's ``qwen3_coder``
parsers do, a value is read by the type its tool declares in the request's ``tools``; unlike them,
a value that fits none of its declared types is an error the model sees, never a guess.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rllm.errors import DeclaredTypeError, DuplicateKeyError

logger = logging.getLogger(__name__)

JSON_TYPES = ("null", "boolean", "integer", "number", "object", "array", "string")
"""JSON Schema's types in the order text is tried against them: ``string`` last, as any text fits it."""

_NULLS = ("null", "None")  # JSON's, and what Qwen3-Coder's template writes for Python's None
_BOOLEANS = {"true": True, "True": True, "false": False, "False": False}
_MAX_DEPTH = 32  # nested $ref/anyOf levels followed before a schema counts as untyped


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not valid JSON")


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"{token} is out of range")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise DuplicateKeyError(key)
        obj[key] = value
    return obj


def loads_strict(text: str) -> Any:
    """``json.loads`` refusing ``NaN``/``Infinity``, floats out of range and objects that repeat a key."""
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                      object_pairs_hook=_unique_keys)


def _json(text: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``text`` is strict JSON, else ``(False, None)``; duplicate keys raise."""
    try:
        return True, loads_strict(text)
    except DuplicateKeyError:
        raise
    except ValueError:
        return False, None


def _read(text: str, json_type: str) -> tuple[bool, Any]:
    """Whether ``text`` fits ``json_type``, and its value when it does."""
    if json_type == "string":
        return True, text
    stripped = text.strip()
    if json_type == "null":
        return stripped in _NULLS, None
    if json_type == "boolean":
        return stripped in _BOOLEANS, _BOOLEANS.get(stripped)
    ok, value = _json(stripped)
    if not ok or isinstance(value, bool):
        return False, None
    if json_type == "integer":
        if isinstance(value, float) and value.is_integer():  # JSON Schema: 4.0 is an integer
            return True, int(value)
        return isinstance(value, int), value
    wanted: dict[str, tuple[type, ...]] = {"number": (int, float), "object": (dict,), "array": (list,)}
    return isinstance(value, wanted[json_type]), value


def read_declared(text: str, types: frozenset[str]) -> Any:
    """``text`` read as the first of ``types`` (in ``JSON_TYPES`` order) that it fits.

    Raises ``DeclaredTypeError`` when it fits none, and ``DuplicateKeyError`` for a JSON object
    value that gives a key twice.
    """
    for json_type in JSON_TYPES:
        if json_type in types:
            fits, value = _read(text, json_type)
            if fits:
                return value
    named = [t for t in JSON_TYPES if t in types and t != "null"] + (["null"] if "null" in types else [])
    raise DeclaredTypeError(" or ".join(named))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string" if isinstance(value, str) else "array" if isinstance(value, list) else "object"


class ToolSchemas:
    """The JSON types each of a request's tools declares for its parameters.

    ``tools`` is the request's tool list in OpenAI's format (``{"type": "function", "function":
    {"name", "parameters"}}``), as engines receive it. Tools of other types are ignored.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self._parameters: dict[str, Mapping[str, Any]] = {}
        for tool in tools or ():
            function = tool.get("function")
            if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
                continue
            name, parameters = function.get("name"), function.get("parameters")
            if isinstance(name, str) and isinstance(parameters, Mapping):
                self._parameters[name] = parameters

    def types(self, tool: str, parameter: str) -> frozenset[str] | None:
        """The JSON types ``tool`` admits for ``parameter``; ``None`` when it declares none.

        Read from ``type`` (a name or a list), ``anyOf``/``oneOf`` (the union), ``allOf`` (the
        intersection), local ``$ref``s, or the values of ``enum``/``const``; a ``null`` default
        admits null. A tool not in the request, a parameter it does not declare, or a schema
        without a type (``{}``, an unknown type name) gives ``None``.
        """
        root = self._parameters.get(tool)
        if root is None:
            return None
        properties = root.get("properties")
        if not isinstance(properties, Mapping) or parameter not in properties:
            return None
        return _declared(properties[parameter], root, 0)


def _declared(schema: Any, root: Mapping[str, Any], depth: int) -> frozenset[str] | None:
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return None
    types = _own_types(schema, root, depth)
    if types is not None and "default" in schema and schema["default"] is None:
        types |= {"null"}
    return types or None


def _own_types(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> frozenset[str] | None:
    if "type" in schema:
        declared = schema["type"]
        names = [declared] if isinstance(declared, str) else declared
        if not isinstance(names, list) or not names or any(name not in JSON_TYPES for name in names):
            logger.debug("parameter schema type %r is not a JSON Schema type; read schema-free", declared)
            return None
        return frozenset(names)
    if "$ref" in schema:
        return _declared(_resolve(schema["$ref"], root), root, depth + 1)
    for union in ("anyOf", "oneOf"):
        if isinstance(schema.get(union), list):
            options = [_declared(option, root, depth + 1) for option in schema[union]]
            if not options or any(option is None for option in options):
                return None
            return frozenset().union(*(o for o in options if o is not None))
    if isinstance(schema.get("allOf"), list):
        parts = [t for t in (_declared(part, root, depth + 1) for part in schema["allOf"]) if t is not None]
        return frozenset.intersection(*parts) if parts else None
    if "const" in schema:
        return frozenset({_json_type(schema["const"])})
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return frozenset(_json_type(value) for value in schema["enum"])
    return None


def _resolve(ref: Any, root: Mapping[str, Any]) -> Any:
    """The schema a local ``$ref`` (``#/$defs/Name``) points to in ``root``, or ``None``."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:]:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part.replace("~1", "/").replace("~0", "~"))
    return node
