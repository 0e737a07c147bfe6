"""core/v1 volume schemas: LocalObjectReference, KeyToPath, the volume sources and Volume.

Patch metadata follows the `k8s.io/api` struct tags (the pod's `volumes` list merges
`merge,retainKeys` by `name`, in `core_v1_pod_schema`). The downwardAPI and projected sources are
kept as written (`preserve_unknown`); their protobuf messages are written out here (`_PB_*`) so
protobuf bodies still decode them (see `schema.proto`).

Invariant: every named struct here is built once and shared; never mutate these dicts.
"""

from __future__ import annotations

from typing import Any

from orchestrator.kube.schema.builders import (
    Schema,
    array,
    boolean,
    integer,
    obj,
    preserve_unknown,
    quantity,
    string,
)
from orchestrator.kube.schema.core_v1_container import V1
from orchestrator.kube.schema.proto import (
    BOOL,
    INT32,
    INT64,
    MESSAGE,
    QUANTITY,
    STRING,
    inline,
    message,
    ptr,
    wire,
)

LOCAL_OBJECT_REFERENCE = obj(
    "Names an object in the same namespace.",
    {"name": string("Name of the referent.")},
    name=f"{V1}.LocalObjectReference",
    map_type="atomic",
    proto={"name": 1},
)

# -- volumes ---------------------------------------------------------------------------------

KEY_TO_PATH = obj(
    "Project one key to a file path.",
    {
        "key": string("The key to project."),
        "path": string("Relative file path to write it to."),
        "mode": integer("File mode bits (0000-0777)."),
    },
    required=("key", "path"),
    name=f"{V1}.KeyToPath",
    proto={"key": 1, "path": 2, "mode": ptr(3)},
)

# Protobuf-only messages: the volume sources the schema keeps as `preserve_unknown` still decode
# from protobuf bodies, with these upstream tables (see `schema.proto`).
_PB_KEY_TO_PATH = message(
    "v1.KeyToPath",
    {"key": wire(1, STRING), "path": wire(2, STRING), "mode": wire(3, INT32, keep=True)},
)
_PB_LOCAL_OBJECT_REFERENCE = inline(
    1, message("v1.LocalObjectReference", {"name": wire(1, STRING)})
)
_PB_DOWNWARD_API_VOLUME_FILE = message(
    "v1.DownwardAPIVolumeFile",
    {
        "path": wire(1, STRING),
        "fieldRef": wire(
            2,
            MESSAGE,
            msg=message(
                "v1.ObjectFieldSelector",
                {"apiVersion": wire(1, STRING), "fieldPath": wire(2, STRING)},
            ),
        ),
        "resourceFieldRef": wire(
            3,
            MESSAGE,
            msg=message(
                "v1.ResourceFieldSelector",
                {
                    "containerName": wire(1, STRING),
                    "resource": wire(2, STRING),
                    "divisor": wire(3, QUANTITY),
                },
            ),
        ),
        "mode": wire(4, INT32, keep=True),
    },
)
_PB_DOWNWARD_API_VOLUME_SOURCE = message(
    "v1.DownwardAPIVolumeSource",
    {
        "items": wire(1, MESSAGE, repeated=True, msg=_PB_DOWNWARD_API_VOLUME_FILE),
        "defaultMode": wire(2, INT32, keep=True),
    },
)


def _pb_key_projection(name: str) -> dict[str, Any]:
    """SecretProjection and ConfigMapProjection: the same fields."""
    return message(
        name,
        {
            "localObjectReference": _PB_LOCAL_OBJECT_REFERENCE,
            "items": wire(2, MESSAGE, repeated=True, msg=_PB_KEY_TO_PATH),
            "optional": wire(4, BOOL, keep=True),
        },
    )


_PB_PROJECTED_VOLUME_SOURCE = message(
    "v1.ProjectedVolumeSource",
    {
        "sources": wire(
            1,
            MESSAGE,
            repeated=True,
            msg=message(
                "v1.VolumeProjection",
                {
                    "secret": wire(1, MESSAGE, msg=_pb_key_projection("v1.SecretProjection")),
                    "downwardAPI": wire(
                        2,
                        MESSAGE,
                        msg=message(
                            "v1.DownwardAPIProjection",
                            {
                                "items": wire(
                                    1, MESSAGE, repeated=True, msg=_PB_DOWNWARD_API_VOLUME_FILE
                                )
                            },
                        ),
                    ),
                    "configMap": wire(3, MESSAGE, msg=_pb_key_projection("v1.ConfigMapProjection")),
                    "serviceAccountToken": wire(
                        4,
                        MESSAGE,
                        msg=message(
                            "v1.ServiceAccountTokenProjection",
                            {
                                "audience": wire(1, STRING),
                                "expirationSeconds": wire(2, INT64, keep=True),
                                "path": wire(3, STRING),
                            },
                        ),
                    ),
                },
            ),
        ),
        "defaultMode": wire(2, INT32, keep=True),
    },
)


VOLUME_SOURCES: dict[str, Schema] = {
    "hostPath": obj(
        "A file or directory on the node.",
        {
            "path": string("Path on the node."),
            "type": string(
                "What must exist at path; empty means no check.",
                enum=(
                    "",
                    "DirectoryOrCreate",
                    "Directory",
                    "FileOrCreate",
                    "File",
                    "Socket",
                    "CharDevice",
                    "BlockDevice",
                ),
            ),
        },
        required=("path",),
        name=f"{V1}.HostPathVolumeSource",
        proto={"path": 1, "type": ptr(2)},
    ),
    "emptyDir": obj(
        "A scratch directory that lives as long as the pod.",
        {
            "medium": string('Storage medium: "" (node disk) or "Memory".'),
            "sizeLimit": quantity("Most the volume may hold."),
        },
        name=f"{V1}.EmptyDirVolumeSource",
        proto={"medium": 1, "sizeLimit": ptr(2)},
    ),
    "configMap": obj(
        "The keys of a ConfigMap as files.",
        {
            "name": string("Name of the ConfigMap."),
            "items": array(KEY_TO_PATH, "Project only these keys.", list_type="atomic"),
            "defaultMode": integer("File mode bits; 0644 by default."),
            "optional": boolean("If true, a missing ConfigMap is not an error."),
        },
        name=f"{V1}.ConfigMapVolumeSource",
        proto={
            "localObjectReference": inline(1, message("v1.LocalObjectReference", {"name": 1})),
            "items": 2,
            "defaultMode": ptr(3),
            "optional": ptr(4),
        },
    ),
    "secret": obj(
        "The keys of a Secret as files.",
        {
            "secretName": string("Name of the Secret."),
            "items": array(KEY_TO_PATH, "Project only these keys.", list_type="atomic"),
            "defaultMode": integer("File mode bits; 0644 by default."),
            "optional": boolean("If true, a missing Secret is not an error."),
        },
        name=f"{V1}.SecretVolumeSource",
        proto={"secretName": 1, "items": 2, "defaultMode": ptr(3), "optional": ptr(4)},
    ),
    "persistentVolumeClaim": obj(
        "A PersistentVolumeClaim in the pod's namespace.",
        {
            "claimName": string("Name of the claim."),
            "readOnly": boolean("Mount read-only."),
        },
        required=("claimName",),
        name=f"{V1}.PersistentVolumeClaimVolumeSource",
    ),
    "downwardAPI": preserve_unknown("Pod fields as files.", proto=_PB_DOWNWARD_API_VOLUME_SOURCE),
    "projected": preserve_unknown(
        "Several sources projected into one directory.", proto=_PB_PROJECTED_VOLUME_SOURCE
    ),
}

VOLUME = obj(
    "A named volume the pod's containers can mount; set exactly one source.",
    {"name": string("Volume name, a DNS label unique within the pod."), **VOLUME_SOURCES},
    required=("name",),
    name=f"{V1}.Volume",
    proto={
        "name": 1,
        "volumeSource": inline(
            2,
            message(
                "v1.VolumeSource",
                {
                    "hostPath": 1,
                    "emptyDir": 2,
                    "secret": 6,
                    "downwardAPI": 16,
                    "configMap": 19,
                    "projected": 26,
                },
            ),
        ),
    },
)
