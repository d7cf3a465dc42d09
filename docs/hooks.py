"""MkDocs hooks: the reference pages are generated at each build, so they cannot go stale.

- ``reference/settings.md``: every environment variable ``grundlag_site/settings.py`` reads,
  found by parsing it (``ast``; it is not imported), with its default and the comment above it.
- ``reference/http-api.md`` and ``reference/openapi.json``: the OpenAPI document, fetched from
  ``/api/openapi.json`` with Django's test client in a child process (fresh code at every build,
  an environment of its own: nothing of the builder's settings leaks into the pages).
- ``reference/commands.md``: each of ``actions/management/commands``'s help, as argparse prints it.
- A page whose markdown holds ``<!-- include: PATH -->`` gets that file of the repository there,
  its links rewritten for the site (CONTRIBUTING.md, CHANGELOG.md, bench/RESULTS.md).

Listed under ``hooks:`` in mkdocs.yml; ``mkdocs build --strict`` runs it (``make docs``).
"""

from __future__ import annotations

import ast
import html
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "grundlag_site" / "settings.py"

# Every setting has a comment directly above where settings.py reads it, and the reference is
# made from those comments: a setting without one fails the build (settings_page).

# The helpers of settings.py that read a variable, and what they make of it.
KINDS = {
    "envbool": "boolean",
    "envint": "integer",
    "envfloat": "number",
    "envlist": "comma-separated list",
    "envorigins": "comma-separated origins",
    "envrate": "rate",
    "getenv": "string",
    "get": "string",
}


@dataclass
class Read:
    """One place settings.py reads an environment variable."""

    name: str
    kind: str
    default: str
    minimum: str | None
    target: str | None  # the setting it is read into, when it is the value of one
    comment: str | None
    line: int


@dataclass
class Setting:
    name: str
    reads: list[Read] = field(default_factory=list)

    @property
    def main(self) -> Read:
        """The read that defines it: the one read into a setting, else the first."""
        for read in self.reads:
            if read.target and read.comment:
                return read
        for read in self.reads:
            if read.target:
                return read
        return self.reads[0]

    @property
    def comment(self) -> str | None:
        return self.main.comment


# Reading settings.py


def _env_readers(tree: ast.Module) -> set[str]:
    """Functions of the module that read os.getenv(<their first parameter>, ...), directly or
    through another such function (envorigins reads through envlist)."""
    readers: set[str] = set()
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    changed = True
    while changed:
        changed = False
        for function in functions:
            if function.name in readers or not function.args.args:
                continue
            first = function.args.args[0].arg
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and (_is_getenv(node) or _called(node) in readers)
                    and node.args
                    and isinstance(node.args[0], ast.Name)
                    and node.args[0].id == first
                ):
                    readers.add(function.name)
                    changed = True
                    break
    return readers


def _called(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _is_getenv(node: ast.Call) -> bool:
    """os.getenv(...) or os.environ.get(...)."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "getenv":
        return isinstance(func.value, ast.Name) and func.value.id == "os"
    return (
        func.attr == "get"
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "environ"
        and isinstance(func.value.value, ast.Name)
        and func.value.value.id == "os"
    )


class _Parents(ast.NodeVisitor):
    """Each node's parent, and each statement's block (the list of statements it is in)."""

    def __init__(self) -> None:
        self.parent: dict[ast.AST, ast.AST] = {}
        self.block: dict[ast.stmt, list[ast.stmt]] = {}

    def generic_visit(self, node: ast.AST) -> None:
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and value and all(isinstance(item, ast.stmt) for item in value):
                for statement in value:
                    self.block[statement] = value
        for child in ast.iter_child_nodes(node):
            self.parent[child] = node
        super().generic_visit(node)


class _Module:
    """settings.py, parsed: which calls read a variable, and what each name stands for."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines()
        self.tree = ast.parse(source)
        self.readers = _env_readers(self.tree)
        self.parents = _Parents()
        self.parents.visit(self.tree)
        # name = <expression>, wherever it is (a default may be a name set just before).
        self.assigned: dict[str, ast.expr] = {}
        # A setting read straight from a variable (CELERY_WORKER_CONCURRENCY <- WORKER_CONCURRENCY),
        # so that a default worked out from it is shown with the variable's name.
        self.aliases: dict[str, ast.Call] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name):
                    self.assigned.setdefault(target.id, node.value)
                    read = _strip_wrappers(node.value)
                    if self.is_read(read):
                        assert isinstance(read, ast.Call)
                        self.aliases.setdefault(target.id, read)

    def is_read(self, node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and (_is_getenv(node) or _called(node) in self.readers)
            and bool(node.args)
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        )

    def comment_above(self, lineno: int) -> str | None:
        """The comment lines directly above line ``lineno`` (1-based), joined, or None."""
        found: list[str] = []
        index = lineno - 2
        while index >= 0 and self.lines[index].strip().startswith("#"):
            found.append(self.lines[index].strip().lstrip("#").strip())
            index -= 1
        return " ".join(reversed(found)) or None

    def statement_of(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            node = self.parents.parent[node]
        return node

    def comment_of(self, node: ast.Call) -> str | None:
        """The comment directly above the read's line, else above its statement, else (for the
        first statement of a block) above the statement that opens the block."""
        if comment := self.comment_above(node.lineno):
            return comment
        current: ast.AST | None = self.statement_of(node)
        while isinstance(current, ast.stmt):
            if comment := self.comment_above(current.lineno):
                return comment
            block = self.parents.block.get(current)
            if not block or block[0] is not current:
                return None
            current = self.parents.parent.get(current)
        return None

    def kind(self, node: ast.Call) -> str:
        parent = self.parents.parent.get(node)
        if isinstance(parent, ast.Call) and _called(parent) == "loads":
            return "JSON"
        if isinstance(parent, ast.Call) and _called(parent) == "Path":
            return "path"
        return KINDS.get(_called(node), "string")

    def target(self, node: ast.Call) -> str | None:
        """The public setting the read is the value of (maybe converted), if it is one."""
        statement = self.statement_of(node)
        if isinstance(statement, ast.Assign):
            target: ast.expr = statement.targets[0]
        elif isinstance(statement, ast.AnnAssign):
            target = statement.target
        else:
            return None
        if not (isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_")):
            return None
        # Up from the read to the value: only through what converts it, never as an argument
        # of something else (PORT is read inside GRUNDLAG_BASE_URL's default, not into it).
        current: ast.AST = node
        while current is not statement.value:
            parent = self.parents.parent[current]
            if isinstance(parent, ast.Call) and parent.func is not current:
                converts = _called(parent) in ("loads", "Path", "ip_network") or (
                    isinstance(parent.func, ast.Attribute) and parent.func.value is current
                )
                if not converts:
                    return None
            if isinstance(parent, ast.BoolOp) and parent.values[0] is not current:
                return None
            current = parent
        return target.id

    def default(self, node: ast.Call) -> str:
        """The default as markdown: a literal as it is; an expression with the variables it is
        worked out from as $NAME, and its value with every default where that can be worked out."""
        default: ast.expr | None = node.args[1] if len(node.args) > 1 else None
        for keyword in node.keywords:
            if keyword.arg == "default":
                default = keyword.value
        parent = self.parents.parent.get(node)
        if default is None or (isinstance(default, ast.Constant) and default.value == ""):
            if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.Or) and parent.values[0] is node:
                default = parent.values[1]
            else:
                return "empty" if default is not None else "unset"
        if isinstance(default, ast.Constant):
            return f"`{default.value!s}`"
        shown = self.expression(default)
        value = self.evaluate(default)
        if value is not None and str(value) != shown:
            return f"`{shown}` ({value} with the defaults)"
        return f"`{shown}`"

    def expression(self, node: ast.expr) -> str:
        """The expression as Python, variables as $NAME, str() conversions left out."""
        module = self

        class Show(ast.NodeTransformer):
            def visit_Call(self, call: ast.Call) -> ast.AST:
                if module.is_read(call):
                    return ast.Name(id=f"${_name_of(call)}")
                if _called(call) == "str" and len(call.args) == 1:
                    inner: ast.AST = self.visit(call.args[0])
                    return inner
                self.generic_visit(call)
                return call

            def visit_Name(self, name: ast.Name) -> ast.AST:
                if name.id in module.aliases:
                    return ast.Name(id=f"${_name_of(module.aliases[name.id])}")
                if name.id.startswith("_") and name.id in module.assigned:  # a private helper value
                    value: ast.AST = self.visit(_copy(module.assigned[name.id]))
                    return value
                return name

        shown = ast.unparse(Show().visit(_copy(node)))
        if isinstance(node, ast.JoinedStr):  # f"http://127.0.0.1:{$PORT}" -> http://127.0.0.1:$PORT
            shown = re.sub(r"\{(\$[A-Z0-9_]+)\}", r"\1", shown)
            shown = re.sub(r"^f?(['\"])(.*)\1$", r"\2", shown)
        return shown

    def evaluate(self, node: ast.expr) -> Any:
        """The value of a default worked out from other variables' defaults, or None."""
        functions: dict[str, Any] = {"str": str, "int": int, "max": max, "min": min}
        operators: dict[type, Any] = {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.FloorDiv: lambda a, b: a // b,
        }

        def value(expr: ast.expr) -> Any:
            if isinstance(expr, ast.Constant):
                return expr.value
            if isinstance(expr, ast.Call) and self.is_read(expr):
                if len(expr.args) < 2:
                    raise ValueError
                raw = value(expr.args[1])
                return int(raw) if _called(expr) == "envint" else raw
            if isinstance(expr, ast.Name) and expr.id in self.aliases:
                return value(self.aliases[expr.id])
            if isinstance(expr, ast.BinOp) and type(expr.op) in operators:
                return operators[type(expr.op)](value(expr.left), value(expr.right))
            if isinstance(expr, ast.Call) and _called(expr) in functions and isinstance(expr.func, ast.Name):
                return functions[expr.func.id](*(value(argument) for argument in expr.args))
            raise ValueError

        try:
            return value(node)
        except (ValueError, TypeError):
            return None


def _copy(node: ast.expr) -> ast.expr:
    copy = ast.parse(ast.unparse(node), mode="eval").body
    return copy


def read_settings(path: Path = SETTINGS) -> list[Setting]:
    """Every variable settings.py reads, in the order it first reads them."""
    module = _Module(path.read_text())
    settings: dict[str, Setting] = {}
    for statement in module.tree.body:
        if isinstance(statement, ast.FunctionDef):
            continue
        for node in ast.walk(statement):
            if not module.is_read(node):
                continue
            assert isinstance(node, ast.Call)
            name = _name_of(node)
            settings.setdefault(name, Setting(name)).reads.append(
                Read(
                    name=name,
                    kind=module.kind(node),
                    default=module.default(node),
                    minimum=_minimum(node),
                    target=module.target(node),
                    comment=module.comment_of(node),
                    line=node.lineno,
                )
            )
    for setting in settings.values():
        setting.reads.sort(key=lambda read: read.line)
    return list(settings.values())


def _name_of(node: ast.Call) -> str:
    first = node.args[0]
    assert isinstance(first, ast.Constant) and isinstance(first.value, str)
    return first.value


def _strip_wrappers(node: ast.expr) -> ast.expr:
    """The read under what only converts it (``envint(...) * 1024``, ``.strip().lower()``)."""
    while True:
        if isinstance(node, ast.BinOp) and isinstance(node.right, ast.Constant):
            node = node.left
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            node = node.values[0]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Call)
            and node.func.attr in ("strip", "lower")
        ):
            node = node.func.value
        else:
            return node


def _minimum(node: ast.Call) -> str | None:
    for keyword in node.keywords:
        if keyword.arg == "minimum":
            return ast.unparse(keyword.value)
    return None


def _comment_markdown(text: str, names: set[str]) -> str:
    """A comment as markdown: HTML escaped, known variables linked outside code spans."""
    parts = html.escape(text, quote=False).split("`")
    pattern = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
    for index in range(0, len(parts), 2):
        parts[index] = pattern.sub(lambda m: f"[`{m.group(1)}`](#{m.group(1)})", parts[index])
    return "`".join(parts)


def settings_page(settings: list[Setting]) -> str:
    names = {setting.name for setting in settings}
    undocumented = [s.name for s in settings if not s.comment]
    if undocumented:
        raise PluginError(
            "grundlag_site/settings.py: no comment above "
            + ", ".join(undocumented)
            + ". Say what each is for in a comment directly above where it is read:"
            " the settings reference (docs/reference/settings.md) is made from those comments."
        )

    out = [
        "# Settings",
        "",
        "Every setting is an environment variable; this page is generated from",
        "`grundlag_site/settings.py` at each build of the site (`docs/hooks.py`), in the order the",
        "file reads them, with the comment written above each. A default that runs on one machine",
        "with nothing installed is set for each; a bad value stops the process at start, naming",
        "the variable. `deploy/env.example` is an example for the scaled setup.",
        "",
        f"{len(settings)} variables. `BASE_DIR` is the project's folder; `$NAME` in a default is",
        "that variable's value.",
        "",
        "| variable | default | type |",
        "| --- | --- | --- |",
    ]
    for setting in settings:
        main = setting.main
        out.append(f"| [`{setting.name}`](#{setting.name}) | {main.default} | {main.kind} |")
    for setting in settings:
        main = setting.main
        out += ["", f"## {setting.name} {{ #{setting.name} }}", ""]
        facts = [f"Default: {main.default}", main.kind]
        if main.minimum:
            facts.append(f"at least {main.minimum}")
        if main.target and main.target != setting.name:
            facts.append(f"read into `{main.target}`")
        others = sorted({r.target for r in setting.reads if r is not main and r.target} - {main.target})
        if others:
            facts.append("also read into " + ", ".join(f"`{t}`" for t in others))
        out += [" · ".join(facts), "", _comment_markdown(setting.comment or "", names)]
    return "\n".join(out) + "\n"


# The OpenAPI document and the management commands, from Django in a child process

CHILD = """
import json, warnings
warnings.simplefilter("ignore")  # WhiteNoise: no STATIC_ROOT in a fresh clone
import django
django.setup()
from pathlib import Path
from django.core.management import load_command_class
from django.test import Client

response = Client().get("/api/openapi.json")
if response.status_code != 200:
    raise SystemExit(f"GET /api/openapi.json answered {response.status_code}")
commands = {}
for path in sorted(Path("actions/management/commands").glob("[!_]*.py")):
    command = load_command_class("actions", path.stem)
    commands[path.stem] = {
        "help": command.help,
        "usage": command.create_parser("manage.py", path.stem).format_help(),
    }
print(json.dumps({"openapi": response.json(), "commands": commands}))
"""


def from_django() -> dict[str, Any]:
    """The OpenAPI document and each command's help, from a fresh interpreter whose settings are
    the defaults (no variable of the builder's), a throwaway directory for GRUNDLAG_VAR_DIR and
    a SQLite file that is never migrated: reading the schema needs no table."""
    with tempfile.TemporaryDirectory(prefix="grundlag-docs-") as scratch:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": scratch,
            "LANG": "C.UTF-8",
            "COLUMNS": "100",  # argparse wraps the help to the terminal's width
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "grundlag_site.settings",
            "SECRET_KEY": "docs-build-only",
            "GRUNDLAG_VAR_DIR": str(Path(scratch) / "var"),
            "DATABASE_URL": f"sqlite:///{scratch}/docs.sqlite3",
        }
        child = subprocess.run(
            [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True, check=False
        )
    if child.returncode != 0:
        raise PluginError(f"docs/hooks.py: Django could not give the OpenAPI document:\n{child.stderr}")
    result: dict[str, Any] = json.loads(child.stdout)
    return result


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few words of markdown, schemas linked to their section."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{name.lower()})"
    for combined in ("anyOf", "oneOf"):
        if combined in schema:
            kinds = [_type(option) for option in schema[combined]]
            return " or ".join(dict.fromkeys(kinds))
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _type(schema["allOf"][0])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(value)}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type")
    if kind == "array":
        return "array of " + _type(schema.get("items", {}))
    if kind == "object" or (kind is None and "additionalProperties" in schema):
        extra = schema.get("additionalProperties")
        return "object of " + _type(extra) if isinstance(extra, dict) and extra else "object"
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "string" and "format" in schema:
        return f"string ({schema['format']})"
    return str(kind) if kind else "any"


def _cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _limits(schema: dict[str, Any]) -> str:
    """A schema's bounds and default in a few words."""
    words = []
    for low, high, unit in (("minimum", "maximum", ""), ("minLength", "maxLength", " characters"),
                            ("minItems", "maxItems", " items")):  # fmt: skip
        if low in schema and high in schema:
            words.append(f"{schema[low]} to {schema[high]}{unit}")
        elif low in schema:
            words.append(f"at least {schema[low]}{unit}")
        elif high in schema:
            words.append(f"at most {schema[high]}{unit}")
    if "default" in schema:
        words.append(f"default `{json.dumps(schema['default'])}`")
    return ", ".join(words)


def _described(description: str, schema: dict[str, Any]) -> str:
    limits = _limits(schema)
    if description and limits:
        return f"{description} ({limits})"
    return description or limits


def http_api_page(document: dict[str, Any]) -> str:
    info = document["info"]
    out = [
        "# HTTP API",
        "",
        f"{info.get('title', '')} {info.get('version', '')}: {info.get('description', '')}",
        "",
        "This page is generated at each build of the site from the OpenAPI document the server",
        "serves at `/api/openapi.json` (the same document, as JSON: [openapi.json](openapi.json)).",
        "A running server also has interactive documentation at `/api/docs`. How to use the API:",
        "[The HTTP API](../how-to/http-api.md).",
        "",
        "Every operation takes a team's API token, `Authorization: Bearer <token>`",
        "(`python manage.py create_api_token <team-slug>` prints one).",
        "",
    ]
    tags: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            tag = (operation.get("tags") or ["other"])[0]
            tags.setdefault(tag, []).append((method, path, operation))
    out += ["## Operations", ""]
    for tag, operations in tags.items():
        out += [
            f"- **{tag}**: "
            + ", ".join(
                f"[`{method.upper()} {path}`](#{_anchor(method, path)})" for method, path, _ in operations
            )
        ]
    for tag, operations in tags.items():
        out += ["", f"## {tag.capitalize()}"]
        for method, path, operation in operations:
            out += _operation(method, path, operation)
    out += ["", "## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        out += _schema(name, schema)
    return "\n".join(out) + "\n"


def _anchor(method: str, path: str) -> str:
    return (method + "-" + re.sub(r"[^a-z0-9]+", "-", path.lower())).strip("-")


def _operation(method: str, path: str, operation: dict[str, Any]) -> list[str]:
    out = ["", f"### `{method.upper()} {path}` {{ #{_anchor(method, path)} }}", ""]
    if summary := operation.get("summary"):
        out += [f"**{summary}**", ""]
    if description := operation.get("description"):
        out += [description.strip(), ""]
    if parameters := operation.get("parameters"):
        out += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
        for parameter in parameters:
            schema = parameter.get("schema", {})
            text = _described(parameter.get("description") or schema.get("description", ""), schema)
            out.append(
                f"| `{parameter['name']}` | {parameter['in']} | {_cell(_type(schema))} |"
                f" {'yes' if parameter.get('required') else 'no'} | {_cell(text)} |"
            )
        out.append("")
    if body := operation.get("requestBody"):
        for media, content in body.get("content", {}).items():
            out += [f"Request body ({media}): {_type(content.get('schema', {}))}", ""]
    out += ["| status | description | body |", "| --- | --- | --- |"]
    for status, response in sorted(operation.get("responses", {}).items(), key=lambda item: str(item[0])):
        contents = response.get("content", {})
        body_type = ", ".join(_type(c.get("schema", {})) for c in contents.values()) or ""
        headers = response.get("headers", {})
        description = response.get("description", "")
        if headers:
            description += " (headers: " + ", ".join(f"`{header}`" for header in headers) + ")"
        out.append(f"| {status} | {_cell(description)} | {_cell(body_type)} |")
    return out


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name} {{ #{name.lower()} }}", ""]
    if description := schema.get("description"):
        out += [description.strip(), ""]
    properties = schema.get("properties")
    if properties:
        required = set(schema.get("required", []))
        out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
        for field_name, field_schema in properties.items():
            text = _described(field_schema.get("description", ""), field_schema)
            out.append(
                f"| `{field_name}` | {_cell(_type(field_schema))} |"
                f" {'yes' if field_name in required else 'no'} | {_cell(text)} |"
            )
    else:
        out.append(f"Type: {_type(schema)}")
    out.append("")
    return out


def commands_page(commands: dict[str, dict[str, str]]) -> str:
    out = [
        "# Management commands",
        "",
        "The project's own `manage.py` commands (`actions/management/commands/`), generated at each",
        "build of the site from each command's `help` and arguments, as",
        "`python manage.py <command> --help` prints them. Django's own (`migrate`,",
        "`collectstatic`, `createsuperuser`, django-axes' `axes_reset`, ...) are documented by",
        "Django and the packages.",
        "",
    ]
    for name, command in commands.items():
        out += ["", f"## {name}", "", command["help"], "", "```text", command["usage"].rstrip(), "```"]
    return "\n".join(out) + "\n"


# Repository files included in a page

INCLUDE = re.compile(r"^<!-- include: (?P<path>[\w./-]+) -->$", re.MULTILINE)
# Where a link of a repository file points in the site: a page of docs/, or one of these.
SITE_PAGES = {
    "README.md": "index.md",
    "CONTRIBUTING.md": "contributing.md",
    "CHANGELOG.md": "changelog.md",
    "bench/RESULTS.md": "explanation/benchmark-results.md",
}


def _included(path: str, page: Page) -> str:
    """The file's markdown, its relative links rewritten to point where the site has them."""
    source = (ROOT / path).read_text()
    # Its first heading is the page's own.
    source = re.sub(r"\A# .*\n+", "", source)
    here = Path(page.file.src_uri).parent
    base = Path(path).parent

    def link(match: re.Match[str]) -> str:
        target, anchor = match.group("target"), match.group("anchor") or ""
        if re.match(r"^[a-z]+:|^/|^#", target):
            return match.group(0)
        in_repo = os.path.normpath(base / target)
        if in_repo.startswith("docs/"):
            in_site = in_repo.removeprefix("docs/")
        elif in_repo in SITE_PAGES:
            in_site = SITE_PAGES[in_repo]
        else:
            raise PluginError(f"{path} links to {target}, which the site does not have")
        return f"]({os.path.relpath(in_site, here)}{anchor})"

    return re.sub(r"\]\((?P<target>[^)#\s]+)(?P<anchor>#[^)\s]*)?\)", link, source)


# MkDocs' events


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated reference pages to the site (nothing is written into docs/)."""
    django = from_django()
    pages = {
        "reference/settings.md": settings_page(read_settings()),
        "reference/http-api.md": http_api_page(django["openapi"]),
        "reference/openapi.json": json.dumps(django["openapi"], indent=2) + "\n",
        "reference/commands.md": commands_page(django["commands"]),
    }
    for uri, content in pages.items():
        if files.get_file_from_path(uri):
            raise PluginError(f"docs/{uri} is generated by docs/hooks.py: remove the file")
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return INCLUDE.sub(lambda match: _included(match.group("path"), page), markdown)
