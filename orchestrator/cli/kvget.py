"""How `orchestrator kv get` shows a value: as text when it is text, exact bytes with `-o json`.

A value is bytes. Without `-o json` it is printed as text when it is text: valid UTF-8 with no
control characters but tab and newline (an escape sequence in a value must not drive the
terminal), followed by a newline unless it ends with one. Anything else — the msgpack objects the
API server stores under `/registry/`, binary data — is not printed: one line on stderr says what
the value is and to add `-o json`, and the status is 1, so a script never takes the hint for the
value.

`-o json` prints one object with the exact bytes and the key's revisions::

    {"key": "/a", "value": "text or null", "value_base64": "...", "create_revision": 2,
     "mod_revision": 5, "version": 3}

`value` is the text when the bytes are valid UTF-8 (every control character escaped as `\\uXXXX`),
else null; `value_base64` is always the exact bytes.
"""

from __future__ import annotations

import base64
import json
import re
from typing import TextIO

from orchestrator.store.types import KeyValue

__all__ = ["as_text", "print_value"]

# C0 controls but tab and newline, DEL and C1 controls: what a terminal may act on.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_C1 = re.compile(r"[\x7f-\x9f]")  # and DEL: left raw by json.dumps(ensure_ascii=False)


def as_text(value: bytes) -> str | None:
    """`value` as text if it is valid UTF-8, else None."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def print_value(kv: KeyValue, output: str, out: TextIO, err: TextIO) -> int:
    """Print `kv`'s value to `out` as `output` (module doc); a hint to `err` instead of a value
    that is not printable text. Returns the exit status."""
    text = as_text(kv.value)
    if output == "json":
        doc = {
            "key": kv.key,
            "value": text,
            "value_base64": base64.b64encode(kv.value).decode("ascii"),
            "create_revision": kv.create_revision,
            "mod_revision": kv.mod_revision,
            "version": kv.version,
        }
        line = json.dumps(doc, ensure_ascii=False)  # JSON escapes C0, not DEL and C1: we do
        out.write(_C1.sub(lambda m: f"\\u{ord(m[0]):04x}", line) + "\n")
        return 0
    if text is None:
        what = f"{len(kv.value)} bytes that are not UTF-8 text"
        if kv.key.startswith("/registry/"):
            what += " (the API server stores objects as msgpack: read them with `orchestrator get`)"
        err.write(f"error: the value of {kv.key} is {what}; add -o json for its exact bytes\n")
        return 1
    if _CONTROL.search(text):
        err.write(
            f"error: the value of {kv.key} is text with control characters, not printed to a "
            "terminal; add -o json for its exact bytes\n"
        )
        return 1
    out.write(text if text.endswith("\n") else text + "\n")
    return 0
