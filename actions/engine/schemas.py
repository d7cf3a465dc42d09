"""Answers that fit a JSON Schema a pause brings (an approval asked for through the API),
rather than an action's answer model: checking the schema, and the answer against it.

The schema comes from outside and is rendered as a form (the dashboard, a mail's page, a
Slack modal), then applied to what reviewers type, in the web process. So it is held to what
a form can be made of, and nothing in it may run long or reach elsewhere: no regular
expressions (``pattern``: one that backtracks holds the process for minutes on a short
answer), no references (``$ref``: nothing to resolve, here or remotely), no true/false
schemas where a field is described, enums of plain values, and at most MAX_SCHEMA_BYTES.
JSON Schema 2020-12, whatever ``$schema`` says."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry

from actions.engine.errors import InvalidInput

logger = logging.getLogger(__name__)

MAX_SCHEMA_BYTES = 16_384

REFUSED = {
    "pattern": "regular expressions are not taken (use enum, minLength and maxLength)",
    "patternProperties": "regular expressions are not taken (name the properties)",
    "$ref": "references are not taken (describe the property where it is used)",
    "$dynamicRef": "references are not taken",
    "$defs": "definitions are not taken (describe each property where it is used)",
    "definitions": "definitions are not taken (describe each property where it is used)",
    "$id": "identifiers are not taken",
    "$anchor": "anchors are not taken",
    "$dynamicAnchor": "anchors are not taken",
    "uniqueItems": "uniqueItems is not taken (comparing every pair of a long list runs long)",
}
MAX_DEPTH = 16
# Where a subschema may be true or false (allowed or not), rather than describe a value.
MAY_BE_BOOLEAN = {"additionalProperties", "unevaluatedProperties", "items", "unevaluatedItems"}
ONE_SUBSCHEMA = ("items", "not", "if", "then", "else", "contains", "propertyNames", "additionalProperties",
                 "unevaluatedProperties", "unevaluatedItems")  # fmt: skip
MANY_SUBSCHEMAS = ("allOf", "anyOf", "oneOf", "prefixItems")
NAMED_SUBSCHEMAS = ("properties", "dependentSchemas")


def field_error(where: str, message: str) -> dict[str, Any]:
    return {"loc": where.split("."), "msg": message, "type": "value_error"}


def _refuse(where: str, message: str) -> InvalidInput:
    return InvalidInput(f"answer_schema: {where}: {message}", [field_error(where, message)])


def _subschemas(node: dict[str, Any], where: str) -> Iterator[tuple[str, str, Any]]:
    """(keyword, where, subschema) for each subschema of ``node``."""
    for keyword in ONE_SUBSCHEMA:
        if keyword in node:
            yield keyword, f"{where}.{keyword}", node[keyword]
    for keyword in MANY_SUBSCHEMAS:
        if isinstance(node.get(keyword), list):
            for n, each in enumerate(node[keyword]):
                yield keyword, f"{where}.{keyword}.{n}", each
    for keyword in NAMED_SUBSCHEMAS:
        if isinstance(node.get(keyword), dict):
            for name, each in node[keyword].items():
                yield keyword, f"{where}.{keyword}.{name}", each


def _check_node(node: Any, where: str, keyword: str) -> None:
    if isinstance(node, bool):
        if keyword not in MAY_BE_BOOLEAN:
            raise _refuse(where, "a true or false schema describes no field: give it a type")
        return
    if not isinstance(node, dict):
        return  # the metaschema says what is wrong
    for refused in REFUSED.keys() & node.keys():
        raise _refuse(f"{where}.{refused}", REFUSED[refused])
    if "enum" in node:
        values = node["enum"]
        scalars = isinstance(values, list) and all(isinstance(value, str | int | float) for value in values)
        if not scalars or not values or len({type(value) for value in values}) != 1:
            raise _refuse(f"{where}.enum", "an enum is a non-empty list of plain values of one type")
    for inner_keyword, inner_where, inner in _subschemas(node, where):
        _check_node(inner, inner_where, inner_keyword)


def _depth(value: Any) -> int:
    deepest, level = 0, [value]
    while level:
        deepest += 1
        level = [
            inner
            for each in level
            if isinstance(each, dict | list)
            for inner in (each.values() if isinstance(each, dict) else each)
            if isinstance(inner, dict | list)
        ]
    return deepest


def check_answer_schema(schema: Any) -> None:
    """Refuse what is not a JSON Schema of an object whose properties a form can show, or takes
    what this module does not take. Raises InvalidInput naming where it is wrong."""
    if not isinstance(schema, dict):
        raise _refuse("answer_schema", "a JSON Schema is an object")
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise _refuse("answer_schema", f"at most {MAX_SCHEMA_BYTES} bytes")
    if _depth(schema) > MAX_DEPTH:
        raise _refuse("answer_schema", f"nested at most {MAX_DEPTH} levels deep")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = ".".join(map(str, ["answer_schema", *exc.absolute_path]))
        raise InvalidInput(
            "answer_schema is not a valid JSON Schema", [field_error(where, exc.message)]
        ) from None
    if schema.get("type") != "object":
        raise _refuse("answer_schema.type", 'must be "object": the answer is a form\'s fields')
    _check_node(schema, "answer_schema", "")


def schema_errors(schema: dict[str, Any], value: Any) -> list[dict[str, Any]]:
    """Where ``value`` does not fit ``schema``, as field errors ({"loc", "msg", "type"}), in the
    shape the engine's other validation errors have. (``format`` is checked too.)"""
    # An empty registry: a reference (of a schema stored before they were refused) resolves to
    # nothing, never to a URL or a file fetched.
    validator = Draft202012Validator(
        schema,
        registry=Registry(),
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    try:
        errors = sorted(validator.iter_errors(value), key=lambda error: list(map(str, error.absolute_path)))
    except Exception as exc:  # noqa: BLE001 - a schema stored before the checks above were made
        logger.warning("an answer schema could not check an answer: %s", exc)
        return [{"loc": [], "msg": "the answer schema cannot check this answer", "type": "json_schema.error"}]
    return [
        {"loc": list(error.absolute_path), "msg": error.message, "type": f"json_schema.{error.validator}"}
        for error in errors
    ]
