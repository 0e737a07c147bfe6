"""RFC 6902 JSON Patch (`application/json-patch+json`).

Theory of operation: the document is deep-copied once, then each operation is applied in order to
the copy; the first failing operation aborts the whole patch (all or nothing). Pointers follow
RFC 6901 (`~1` is `/`, `~0` is `~`, `-` appends to an array). Every value taken from the patch is
copied before it is placed, so the result shares nothing with the inputs.

A malformed patch (not a list, an operation without `op`/`path`/`value`) is a 400 BadRequest;
a well-formed patch that does not apply (missing path, failed `test`, index out of range) is a
422 Invalid, as Kubernetes reports it.
"""

from __future__ import annotations

from typing import Any

from orchestrator.kube.errors import ApiError, bad_request
from orchestrator.kube.patch._util import copy_json, json_equal, short

__all__ = ["apply_json_patch", "parse_pointer"]


def _invalid(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def parse_pointer(pointer: Any) -> list[str]:
    """Split an RFC 6901 JSON pointer into unescaped reference tokens."""
    if not isinstance(pointer, str):
        raise bad_request(f"json patch path must be a string, got {short(pointer)}")
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise bad_request(f'json patch path must start with "/": "{pointer}"')
    tokens = []
    for raw in pointer[1:].split("/"):
        rest = raw.replace("~0", "").replace("~1", "")
        if "~" in rest:
            raise bad_request(f'invalid escape in json patch path "{pointer}" (use ~0 or ~1)')
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tokens


def _index(token: str, length: int, pointer: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not token.isascii() or not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise _invalid(f'invalid array index "{token}" in path "{pointer}"')
    index = int(token)
    limit = length if allow_end else length - 1
    if index > limit:
        raise _invalid(f'index {index} out of bounds (array length {length}) in path "{pointer}"')
    return index


def _parent(doc: Any, tokens: list[str], pointer: str) -> Any:
    """The container holding the last token of `tokens` (tokens must be non-empty)."""
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise _invalid(f'doc is missing path: "{pointer}"')
            node = node[token]
        elif isinstance(node, list):
            if token == "-":
                raise _invalid(f'doc is missing path: "{pointer}"')
            node = node[_index(token, len(node), pointer, allow_end=False)]
        else:
            raise _invalid(f'doc is missing path: "{pointer}"')
    if not isinstance(node, dict | list):
        raise _invalid(f'doc is missing path: "{pointer}"')
    return node


def _get(doc: Any, pointer: str) -> Any:
    tokens = parse_pointer(pointer)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid(f'doc is missing path: "{pointer}"')
        return parent[last]
    if last == "-":
        raise _invalid(f'doc is missing path: "{pointer}"')
    return parent[_index(last, len(parent), pointer, allow_end=False)]


def _add(doc: Any, pointer: str, value: Any) -> Any:
    tokens = parse_pointer(pointer)
    if not tokens:
        return value
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    else:
        parent.insert(_index(last, len(parent), pointer, allow_end=True), value)
    return doc


def _remove(doc: Any, pointer: str) -> tuple[Any, Any]:
    """Remove the value at `pointer`; returns (new doc, removed value)."""
    tokens = parse_pointer(pointer)
    if not tokens:
        return None, doc
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid(f'doc is missing path: "{pointer}"')
        return doc, parent.pop(last)
    if last == "-":
        raise _invalid(f'doc is missing path: "{pointer}"')
    return doc, parent.pop(_index(last, len(parent), pointer, allow_end=False))


def _replace(doc: Any, pointer: str, value: Any) -> Any:
    tokens = parse_pointer(pointer)
    if not tokens:
        return value
    parent = _parent(doc, tokens, pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid(f'doc is missing path: "{pointer}"')
        parent[last] = value
    else:
        if last == "-":
            raise _invalid(f'doc is missing path: "{pointer}"')
        parent[_index(last, len(parent), pointer, allow_end=False)] = value
    return doc


def _field(op: dict[str, Any], name: str, number: int) -> Any:
    if name not in op:
        raise bad_request(f'json patch operation {number} ("{op.get("op")}") is missing "{name}"')
    return op[name]


def _apply_op(doc: Any, op: Any, number: int) -> Any:
    if not isinstance(op, dict):
        raise bad_request(f"json patch operation {number} must be an object, got {short(op)}")
    kind = op.get("op")
    path = _field(op, "path", number)
    if not isinstance(path, str):
        raise bad_request(f"json patch operation {number}: path must be a string")
    if kind == "add":
        return _add(doc, path, copy_json(_field(op, "value", number)))
    if kind == "remove":
        return _remove(doc, path)[0]
    if kind == "replace":
        return _replace(doc, path, copy_json(_field(op, "value", number)))
    if kind == "test":
        expected = _field(op, "value", number)
        actual = _get(doc, path)
        if not json_equal(actual, expected):
            raise _invalid(
                f'jsonpatch test operation does not apply: "{path}" is {short(actual)}, '
                f"not {short(expected)}"
            )
        return doc
    if kind in ("move", "copy"):
        source = _field(op, "from", number)
        if not isinstance(source, str):
            raise bad_request(f'json patch operation {number}: "from" must be a string')
        parse_pointer(source)
        if kind == "move":
            if source == path:
                _get(doc, source)
                return doc
            if path.startswith(source + "/"):
                raise _invalid(f'cannot move "{source}" into its own child "{path}"')
            doc, value = _remove(doc, source)
            return _add(doc, path, value)
        return _add(doc, path, copy_json(_get(doc, source)))
    raise bad_request(f"json patch operation {number} has unknown op {short(kind)}")


def apply_json_patch(doc: Any, ops: Any) -> Any:
    """Apply the RFC 6902 operations `ops` to a copy of `doc` and return the result."""
    if not isinstance(ops, list):
        raise bad_request("json patch must be a JSON array of operations")
    result = copy_json(doc)
    try:
        for number, op in enumerate(ops):
            result = _apply_op(result, op, number)
    except RecursionError:
        raise bad_request("json patch document is nested too deeply") from None
    return result
