"""Answers that fit a JSON Schema a pause brings (an approval asked for through the API),
rather than an action's answer model: checking the schema, and the answer against it."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from actions.engine.errors import InvalidInput


def check_answer_schema(schema: Any) -> None:
    """Refuse what is not a JSON Schema describing an object (the dashboard renders its
    properties as a form's fields). Raises InvalidInput naming where it is wrong."""
    if not isinstance(schema, dict):
        raise InvalidInput(
            "answer_schema must be a JSON Schema (an object)", [field_error("answer_schema", "not an object")]
        )
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = ".".join(map(str, ["answer_schema", *exc.absolute_path]))
        raise InvalidInput(
            "answer_schema is not a valid JSON Schema", [field_error(where, exc.message)]
        ) from None
    if schema.get("type") != "object":
        raise InvalidInput(
            'answer_schema must describe an object ("type": "object"): the answer is a form\'s fields',
            [field_error("answer_schema.type", 'must be "object"')],
        )


def schema_errors(schema: dict[str, Any], value: Any) -> list[dict[str, Any]]:
    """Where ``value`` does not fit ``schema``, as field errors ({"loc", "msg", "type"}), in the
    shape the engine's other validation errors have."""
    validator = validator_for(schema, default=Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(value), key=lambda error: list(map(str, error.absolute_path)))
    return [
        {"loc": list(error.absolute_path), "msg": error.message, "type": f"json_schema.{error.validator}"}
        for error in errors
    ]


def field_error(where: str, message: str) -> dict[str, Any]:
    return {"loc": where.split("."), "msg": message, "type": "value_error"}
