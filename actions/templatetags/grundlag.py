from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from actions.core import MAX_NESTING, value_problem
from actions.reads.history import human

register = template.Library()

FOLD_AT = 160
MAX_DEPTH = 8


@register.filter
def as_data(value: Any) -> SafeString:
    """Render JSON readably: objects as definition lists, lists as ordered lists, long text
    folded behind a <details>. Everything is escaped."""
    return mark_safe(_render(value, 0))  # noqa: S308 - every leaf below goes through escape()


@register.filter
def as_text(value: Any) -> str:
    """JSON as indented ``key: value`` lines, for a plain-text mail."""
    return "\n".join(_text_lines(value, 0)) or "(nothing)"


def _text_lines(value: Any, depth: int) -> list[str]:
    pad = "  " * depth
    if depth >= MAX_DEPTH:
        return [pad + "(too deep to show)"]
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                lines += [f"{pad}{key}:", *_text_lines(item, depth + 1)]
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            inner = _text_lines(item, depth + 1)
            lines.append(f"{pad}- {inner[0].strip()}" if inner else f"{pad}-")
            lines += inner[1:]
        return lines
    return [pad + _scalar(value)]


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, bool) or value == {} or value == []:
        return json.dumps(value)
    return str(value)


TOO_DEEP = '<span class="muted too-deep">(too deep to show)</span>'


def _render(value: Any, depth: int) -> str:
    if depth >= MAX_DEPTH:
        # Deeper levels as JSON text, if that can be written at all: a stored value's depth
        # was an attacker's choice before it was bounded, and a page must render anyway.
        if value_problem(value, MAX_NESTING) is not None:
            return TOO_DEEP
        return _leaf(json.dumps(value, ensure_ascii=False))
    if isinstance(value, dict):
        if not value:
            return '<span class="muted">{}</span>'
        items = "".join(
            f"<dt>{escape(str(key))}</dt><dd>{_render(item, depth + 1)}</dd>" for key, item in value.items()
        )
        return f'<dl class="data">{items}</dl>'
    if isinstance(value, list):
        if not value:
            return '<span class="muted">[]</span>'
        items = "".join(f"<li>{_render(item, depth + 1)}</li>" for item in value)
        return f'<ol class="data">{items}</ol>'
    if value is None:
        return '<span class="muted">null</span>'
    if isinstance(value, bool):
        return f"<code>{'true' if value else 'false'}</code>"
    if isinstance(value, (int, float)):
        return f"<code>{escape(str(value))}</code>"
    return _leaf(str(value))


def _leaf(text: str) -> str:
    if len(text) <= FOLD_AT:
        return f'<span class="value">{escape(text)}</span>'
    return str(
        format_html(
            '<details class="fold"><summary>{}…</summary><span class="value">{}</span></details>',
            text[:FOLD_AT],
            text,
        )
    )


@register.filter
def when(value: datetime | None, part: str = "datetime") -> SafeString:
    """A moment as a <time> that static/js/live.js shows in the reader's time zone (the absolute
    time on hover); without JavaScript, in UTC, saying so. ``part``: datetime, or time."""
    if value is None:
        return mark_safe("")  # noqa: S308 - nothing to escape
    utc = value.astimezone(UTC)
    shown = utc.strftime("%H:%M" if part == "time" else "%Y-%m-%d %H:%M")
    return format_html(
        '<time datetime="{}" data-local="{}" title="{} UTC">{} UTC</time>',
        utc.isoformat(),
        "time" if part == "time" else "datetime",
        utc.strftime("%Y-%m-%d %H:%M:%S"),
        shown,
    )


@register.filter
def age(value: datetime) -> str:
    """How long ago, for people: "just now", "4 minutes", "2 hours, 3 minutes"."""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


@register.filter
def order_key(value: datetime, pk: int) -> str:
    """A row's place in the inbox (newest first: by creation, then id), as one string that
    sorts as the list does: the page inserts a pushed row by it."""
    return f"{int(value.timestamp() * 1_000_000):020d}-{int(pk):012d}"


@register.filter
def duration(seconds: float) -> str:
    """Seconds, as people say them: 40 s, 12 min, 3.5 h, 2.1 d."""
    return human(float(seconds))


@register.filter
def percent(share: float) -> str:
    """A share (0..1) as a whole percentage."""
    return f"{float(share):.0%}"
