"""Patching: JSON patch, JSON merge patch, strategic merge patch and server-side apply.

Everything here is pure, synchronous and deterministic: values in, new values out, inputs never
mutated, failures only as `ApiError` (400 for malformed patches, 422 for JSON patches that do not
apply, 409 for apply conflicts). The schema argument is the kind's structural OpenAPI v3 schema;
its `x-kubernetes-*` extensions decide how lists and maps merge.
"""

from orchestrator.kube.patch.apply import server_side_apply, track_update
from orchestrator.kube.patch.fieldpath import (
    FieldSet,
    Path,
    decode_fields_v1,
    encode_fields_v1,
    fieldset_of,
    path_string,
)
from orchestrator.kube.patch.jsonpatch import apply_json_patch
from orchestrator.kube.patch.mergepatch import apply_merge_patch, create_merge_patch
from orchestrator.kube.patch.strategic import (
    apply_strategic_merge_patch,
    create_three_way_merge_patch,
    create_two_way_merge_patch,
)

__all__ = [
    "FieldSet",
    "Path",
    "apply_json_patch",
    "apply_merge_patch",
    "apply_strategic_merge_patch",
    "create_merge_patch",
    "create_three_way_merge_patch",
    "create_two_way_merge_patch",
    "decode_fields_v1",
    "encode_fields_v1",
    "fieldset_of",
    "path_string",
    "server_side_apply",
    "track_update",
]
