"""Request and response bodies: JSON (and YAML, and Kubernetes protobuf) in, compact JSON out.

Bodies are decoded as JSON, or YAML for apply and `application/yaml`, or Kubernetes protobuf
for the typed clients of kubectl's generators (see `kube.protobuf`, imported on the first
protobuf body); malformed input is a 400 Status. Strings are decoded as Go's encoding/json
does: invalid UTF-8 and lone UTF-16 surrogates (escaped `"\\ud800"` or raw `ED A0 80`) become
U+FFFD, so no string the app holds can fail to encode later (a 500 after a write, or a body
that is not JSON). YAML anchors and aliases are refused (no alias bombs); non-finite numbers
are refused in both (they would be served as `Infinity`, which is not JSON).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

from orchestrator.kube import errors


def dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate got past `decode_body` (it should not): escaped, it is still JSON,
        # which a Go client reads as U+FFFD, rather than a 500 with no body.
        return json.dumps(obj, separators=(",", ":")).encode()


_SURROGATE = re.compile("[\ud800-\udfff]")
# An escape that may decode to a surrogate code point (JSON `\uD8..`, YAML also `\UD8..`):
# bodies without one (nearly all) skip the walk below.
_SURROGATE_ESCAPE = re.compile(rb"\\(?:u|U0000)[dD][89abcdefABCDEF]")


def replace_surrogates(value: Any) -> Any:
    """`value` with every surrogate code point in its strings (keys too) replaced by U+FFFD.
    json.loads pairs valid surrogate escapes into one character, so those left are lone ones:
    Go's decoder replaces them so, and UTF-8 cannot encode them."""
    t = type(value)
    if t is str:
        return _SURROGATE.sub("\ufffd", value)
    if t is dict:
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    if t is list:
        return [replace_surrogates(v) for v in value]
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    # 1e999 would parse as inf and be stored, then served as `Infinity`: not JSON.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a JSON number")
    return value


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without anchors/aliases: an alias bomb must not expand into gigabytes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML is untyped
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_finite_float(self, node: Any) -> float:
        value: float = self.construct_yaml_float(node)
        if not math.isfinite(value):  # .inf/.nan would be served as Infinity/NaN: not JSON
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value} is not a finite number", node.start_mark
            )
        return value


_NoAliasLoader.add_constructor("tag:yaml.org,2002:float", _NoAliasLoader.construct_finite_float)


PROTOBUF = "application/vnd.kubernetes.protobuf"  # `protobuf.MEDIA_TYPE`, without the import
_BINARY_BODY_TYPES = frozenset({PROTOBUF, "application/cbor"})
_YAML_TYPES = frozenset({"application/yaml", "application/apply-patch+yaml", "text/yaml"})
# What a create or update body may be (`text/yaml` too, as before: it is read as YAML).
BODY_TYPES = frozenset({"application/json", "application/yaml", "text/yaml", PROTOBUF})
ACCEPTED_BODY_TYPES = f"application/json, application/yaml, {PROTOBUF}"


def media_type(content_type: str) -> str:
    """The media type of a Content-Type value, without parameters, lower case."""
    return content_type.split(";")[0].strip().lower()


def decode_body(body: bytes, content_type: str) -> Any:
    if not body:
        return None
    ct = media_type(content_type)
    if ct == PROTOBUF:  # typed clients (kubectl's generators) send only protobuf
        from orchestrator.kube import protobuf

        return replace_surrogates(protobuf.decode(body))  # FieldsV1 inside is JSON
    if ct in _BINARY_BODY_TYPES:
        raise errors.unsupported_media_type(ct, "application/json, application/yaml")
    # Not json.loads(bytes): it decodes with "surrogatepass", so raw ED A0 80 would become a
    # lone surrogate. Invalid UTF-8 becomes U+FFFD, as in Go (one per invalid byte).
    text = body.decode("utf-8", "replace")
    try:
        if ct in _YAML_TYPES:
            value = yaml.load(text, Loader=_NoAliasLoader)
        else:
            value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise errors.bad_request(
            f"the request body is not valid JSON or YAML: {replace_surrogates(message)}"
        ) from exc
    if _SURROGATE_ESCAPE.search(body) is not None:
        value = replace_surrogates(value)
    return value
