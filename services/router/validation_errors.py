"""A request that fails validation, told in the client's words: the field as the client wrote it
(`messages.0.content`, never pydantic's union branch names such as `stop.str`), one message per
field, and what is wrong with a body that is not a JSON object at all."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_NAMED = re.compile(r"^(\w+): ")  # a model-level check names its field first ("best_of: ...")


def client_path(body: Any, loc: Sequence[Any]) -> list[str]:
    """The leading part of a pydantic error location that indexes into the client's body; what
    follows it names the union branch or validator pydantic tried, not anything the client sent."""
    path, node = [], body
    for part in loc:
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not _is_branch_tag(part):
            path.append(part)  # a required field the body lacks
            break
        else:
            break
        path.append(str(part))
    return path


def _is_branch_tag(part: str) -> bool:
    """Whether `part` is a pydantic branch tag ("str", "list[str]", "function-after[...]")."""
    return "[" in part or part in {"str", "int", "float", "bool", "list", "dict", "none"}


def validation_message(errors: Sequence[dict], body: Any) -> tuple[str, str | None]:
    """(message, param) of the first field that failed."""
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if not loc:
        return _whole_body(first, body)
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    path = client_path(body, loc)
    param = ".".join(path) or None
    if first.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    same = [e for e in errors if client_path(body, [p for p in e["loc"] if p != "body"]) == path]
    msgs = dict.fromkeys(_text(e) for e in same)  # a union's branches: each reason once
    return f"{param}: {' or '.join(msgs)}" if param else " or ".join(msgs), param


def _whole_body(error: dict, body: Any) -> tuple[str, str | None]:
    """A body-level failure: empty, not JSON, not a JSON object, or a check across fields."""
    kind = error.get("type")
    if kind == "missing":
        return "the request body is empty: it must be a JSON object", None
    if kind == "json_invalid":
        return "the request body is not valid JSON", None
    if isinstance(error.get("input"), bytes | str):
        return "the request body must be JSON (content-type: application/json)", None
    if kind in ("model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object", None
    message = _text(error)
    named = _NAMED.match(message)
    return message, named.group(1) if named and isinstance(body, dict) else None


def _text(error: dict) -> str:
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")
