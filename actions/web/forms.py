"""Django forms generated from an action's JSON Schema (its pydantic input or answer model).

The pydantic model stays the authority: the form renders fields and parses browser strings,
then the model validates, and its errors are put back on the fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.utils.html import escape

from actions import engine
from actions.conditions import ConditionError
from actions.core import registry

MAX_TEXT_INPUT = 200
_BOOLEAN_CHOICE = {True: "true", False: "false"}


def _resolve(prop: dict[str, Any], schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Follow $ref and unwrap Optional[...] (anyOf with null). Returns (property, nullable)."""
    nullable = False
    if "anyOf" in prop:
        options = [p for p in prop["anyOf"] if p.get("type") != "null"]
        nullable = len(options) < len(prop["anyOf"])
        if len(options) == 1:
            prop = {**prop, **options[0]}
            prop.pop("anyOf", None)
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        prop = {**schema.get("$defs", {}).get(name, {}), **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop, nullable


def _field(prop: dict[str, Any], required: bool) -> forms.Field:
    common: dict[str, Any] = {
        "required": required,
        "label": prop.get("title"),
        # Django renders help text as it is (|safe): a schema may come from outside (an
        # approval asked through the API), so it is escaped here, as every other text is.
        "help_text": escape(prop.get("description", "")),
    }
    if "default" in prop:
        common["initial"] = prop["default"]
    kind = prop.get("type")
    if "enum" in prop:
        values = prop["enum"]
        if all(isinstance(value, bool) for value in values):  # bool("False") is True: by name
            if "default" in prop:
                common["initial"] = _BOOLEAN_CHOICE[bool(prop["default"])]
            choices = [(_BOOLEAN_CHOICE[value], str(value)) for value in values]
            return forms.TypedChoiceField(choices=choices, coerce=lambda text: text == "true", **common)
        choices = [(value, str(value)) for value in values]
        coerce: Callable[[Any], Any] = type(values[0])
        return forms.TypedChoiceField(choices=choices, coerce=coerce, **common)
    if kind == "boolean":
        return forms.BooleanField(**{**common, "required": False})
    if kind == "integer":
        return forms.IntegerField(min_value=prop.get("minimum"), max_value=prop.get("maximum"), **common)
    if kind == "number":
        return forms.FloatField(min_value=prop.get("minimum"), max_value=prop.get("maximum"), **common)
    if kind == "string":
        max_length = prop.get("maxLength")
        long_text = max_length is not None and max_length > MAX_TEXT_INPUT
        widget = forms.Textarea(attrs={"rows": 4}) if long_text else None
        return forms.CharField(
            max_length=max_length, min_length=prop.get("minLength"), widget=widget, strip=True, **common
        )
    # Objects, arrays and unions: typed as JSON, validated by the model.
    return forms.JSONField(widget=forms.Textarea(attrs={"rows": 4, "class": "json"}), **common)


class SchemaForm(forms.Form):
    schema: dict[str, Any] = {}

    def payload(self) -> dict[str, Any]:
        """The cleaned values to hand to the model; empty optional fields are left out so the
        model's defaults apply."""
        data = {}
        for name, value in self.cleaned_data.items():
            if value in (None, "") and not self.fields[name].required:
                continue
            data[name] = value
        return data

    def edited_arguments(self) -> dict[str, Any]:
        """The initial values (a tool call's proposed arguments) with the fields the reviewer
        changed put on top: a field left alone keeps its value exactly, whatever a browser's
        input does to text (newlines, spaces); one emptied is left out, for the model's default."""
        arguments = dict(self.initial)
        for name in self.changed_data:
            value = self.cleaned_data.get(name)
            if _as_posted(self.fields[name], self.initial.get(name)) == _as_posted(self.fields[name], value):
                continue  # what the browser did to the text, not an edit
            if value in (None, "") and not self.fields[name].required:
                arguments.pop(name, None)
            else:
                arguments[name] = value
        return arguments

    def add_model_errors(self, errors: list[dict[str, Any]]) -> None:
        for error in errors:
            loc = error.get("loc") or []
            field = str(loc[0]) if loc and str(loc[0]) in self.fields else None
            self.add_error(field, error["msg"])


def _as_posted(field: forms.Field, value: Any) -> Any:
    """``value`` as it comes back from a browser's field: cleaned the way the field cleans
    (text stripped), with a textarea's CRLF line ends."""
    try:
        value = field.to_python(value)
    except forms.ValidationError:
        return value
    return value.replace("\r\n", "\n") if isinstance(value, str) else value


def form_for_schema(schema: dict[str, Any]) -> type[SchemaForm]:
    fields: dict[str, Any] = {"schema": schema}
    required = set(schema.get("required", []))
    for name, raw in schema.get("properties", {}).items():
        prop, nullable = _resolve(raw, schema)
        fields[name] = _field(prop, name in required and not nullable)
    return type("SchemaForm", (SchemaForm,), fields)


class ApprovalForm(forms.Form):
    """Approval for actions without an answer model: resumes with {"approved": true, ...}."""

    comment = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}), help_text="Optional"
    )

    def payload(self) -> dict[str, Any]:
        return {"approved": True, "comment": self.cleaned_data["comment"]}

    def add_model_errors(self, errors: list[dict[str, Any]]) -> None:
        for error in errors:
            self.add_error(None, error["msg"])


class GrantForm(forms.Form):
    """On the approve form: approve, and allow the same for a while (a standing grant).
    Prefixed "grant"."""

    LASTING = [("", "Just this once")] + [(key, label) for key, (label, _) in engine.GRANT_LASTING.items()]
    lasting = forms.ChoiceField(
        choices=LASTING, required=False, widget=forms.RadioSelect, label="Allow the same", initial=""
    )
    scope = forms.ChoiceField(
        choices=[("same", "with the same arguments"), ("condition", "with arguments where (CEL)")],
        required=False,
        widget=forms.RadioSelect,
        initial="same",
        label="",
    )
    condition = forms.CharField(
        required=False,
        max_length=2000,
        label="Condition",
        help_text="e.g. <code>data.amount &lt;= 50.0</code>; it reads data, input, action, team and "
        "requester.",
    )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("lasting") and cleaned.get("scope") == "condition":
            condition = (cleaned.get("condition") or "").strip()
            if not condition:
                self.add_error("condition", "Write the condition the arguments must meet.")
            else:
                try:
                    engine.compile_condition(condition)
                except ConditionError as exc:
                    self.add_error("condition", f"This is not a condition a grant can use: {exc}.")
            cleaned["condition"] = condition
        else:
            cleaned["condition"] = ""
        return cleaned


class RejectForm(forms.Form):
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Required. The run ends rejected with this reason.",
    )


def answer_form(interrupt: Any, data: Any = None) -> SchemaForm | ApprovalForm:
    """The form that approves ``interrupt``: its own answer schema's, its action's answer
    model's, or a plain approval.
    Never prefilled with an earlier approver's answer (N-of-M): each approver enters theirs,
    so a safeguard such as retyping an id holds for each."""
    if interrupt.answer_schema is not None:  # the pause's own (an approval asked through the API)
        return form_for_schema(interrupt.answer_schema)(data, prefix="answer")
    act = registry.find(interrupt.action)
    if act is not None and act.answer_model is not None:
        return form_for_schema(act.answer_schema() or {})(data, prefix="answer")
    return ApprovalForm(data, prefix="answer")
