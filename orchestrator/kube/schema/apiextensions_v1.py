"""apiextensions.k8s.io/v1 CustomResourceDefinition, as `CRD`.

A CRD's `openAPIV3Schema` is stored as written (a preserve-unknown object: the schema dialect is
checked by whoever turns a CRD into a custom Kind, not here). The names controller fills
`status.acceptedNames`, `storedVersions` and the NamesAccepted/Established conditions.

Invariants: `metadata.name` is `<plural>.<group>`; exactly one version is the storage version;
scope never changes; defaults (singular, listKind, conversion) are idempotent.
"""

from __future__ import annotations

from orchestrator.kube.errors import Cause
from orchestrator.kube.objects import Obj
from orchestrator.kube.schema import crd_validation
from orchestrator.kube.schema.builders import (
    array,
    boolean,
    integer,
    obj,
    preserve_unknown,
    string,
    strings,
)
from orchestrator.kube.schema.columns import NAME
from orchestrator.kube.schema.kind import Column, Kind
from orchestrator.kube.schema.meta import (
    condition,
    conditions,
    ensure,
    get,
    invalid,
    object_schema,
)

APIEXT = "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1"

CRD_NAMES = obj(
    "The names the custom resource is served under.",
    {
        "plural": string("Plural resource name used in URLs, lower case, e.g. widgets."),
        "singular": string("Singular name; the lower-cased kind by default."),
        "kind": string("CamelCase kind of the objects, e.g. Widget."),
        "listKind": string("Kind of lists; <kind>List by default."),
        "shortNames": strings("Short aliases for kubectl, e.g. wd."),
        "categories": strings("Groups the resource belongs to, e.g. all."),
    },
    required=("plural", "kind"),
    name=f"{APIEXT}.CustomResourceDefinitionNames",
)

PRINTER_COLUMN = obj(
    "An extra column for `kubectl get`.",
    {
        "name": string("Column title."),
        "type": string(
            "OpenAPI type of the value.", enum=("integer", "number", "string", "boolean", "date")
        ),
        "format": string("OpenAPI format of the value, e.g. name."),
        "description": string("What the column shows."),
        "priority": integer("0 = always shown; higher = only with -o wide."),
        "jsonPath": string("Simple JSONPath into each object, e.g. .spec.replicas."),
    },
    required=("name", "type", "jsonPath"),
    name=f"{APIEXT}.CustomResourceColumnDefinition",
)

CRD_VERSION = obj(
    "One served version of the custom resource.",
    {
        "name": string("Version name as it appears in URLs, e.g. v1."),
        "served": boolean("Serve this version over the API."),
        "storage": boolean("Store objects in this version; exactly one version has it."),
        "deprecated": boolean("Warn clients that use this version."),
        "deprecationWarning": string("Warning text for clients of a deprecated version."),
        "schema": obj(
            "Validation schema of this version.",
            {
                "openAPIV3Schema": preserve_unknown(
                    "Structural OpenAPI v3 schema of the objects.",
                    name=f"{APIEXT}.JSONSchemaProps",
                )
            },
            name=f"{APIEXT}.CustomResourceValidation",
        ),
        "subresources": obj(
            "Subresources the custom resource serves.",
            {
                "status": obj(
                    "Serve /status; the main resource then ignores status.",
                    {},
                    name=f"{APIEXT}.CustomResourceSubresourceStatus",
                ),
                "scale": obj(
                    "Serve /scale.",
                    {
                        "specReplicasPath": string("JSON path of the desired replicas."),
                        "statusReplicasPath": string("JSON path of the observed replicas."),
                        "labelSelectorPath": string("JSON path of the label selector string."),
                    },
                    required=("specReplicasPath", "statusReplicasPath"),
                    name=f"{APIEXT}.CustomResourceSubresourceScale",
                ),
            },
            name=f"{APIEXT}.CustomResourceSubresources",
        ),
        "additionalPrinterColumns": array(
            PRINTER_COLUMN, "Extra `kubectl get` columns.", list_type="atomic"
        ),
    },
    required=("name", "served", "storage"),
    name=f"{APIEXT}.CustomResourceDefinitionVersion",
)

CRD_SPEC = obj(
    "What the custom resource is called and how each version looks.",
    {
        "group": string("API group, a DNS subdomain with at least one dot, e.g. example.com."),
        "names": CRD_NAMES,
        "scope": string("Namespaced or Cluster.", enum=("Namespaced", "Cluster")),
        "versions": array(CRD_VERSION, "The versions, in priority order.", list_type="atomic"),
        "conversion": obj(
            "How objects convert between versions.",
            {
                "strategy": string("None (default) or Webhook.", enum=("None", "Webhook")),
                "webhook": preserve_unknown("Webhook settings (not supported)."),
            },
            required=("strategy",),
            name=f"{APIEXT}.CustomResourceConversion",
        ),
        "preserveUnknownFields": boolean("Deprecated; must be false."),
    },
    required=("group", "names", "scope", "versions"),
    name=f"{APIEXT}.CustomResourceDefinitionSpec",
)

CRD_STATUS = obj(
    "Observed state of the definition.",
    {
        "conditions": conditions(
            condition(f"{APIEXT}.CustomResourceDefinitionCondition", "A CRD condition.")
        ),
        "acceptedNames": CRD_NAMES,
        "storedVersions": strings("Versions objects have ever been stored in."),
    },
    name=f"{APIEXT}.CustomResourceDefinitionStatus",
)


def default_crd(crd: Obj) -> None:
    spec = ensure(crd, "spec")
    names = ensure(spec, "names")
    kind = names.get("kind")
    if isinstance(kind, str) and kind:
        names.setdefault("singular", kind.lower())
        names.setdefault("listKind", f"{kind}List")
    ensure(spec, "conversion").setdefault("strategy", "None")


def validate_crd(new: Obj, old: Obj | None) -> list[Cause]:
    """The CRD checks of `crd_validation.validate_crd` (names, versions, structural schemas),
    plus the fields that may not change on update."""
    causes = crd_validation.validate_crd(new)
    if old is not None:
        old_scope = get(old, "spec.scope")
        if old_scope and get(new, "spec.scope") != old_scope:
            causes.append(invalid("spec.scope", get(new, "spec.scope"), "field is immutable"))
    return causes


CRD = Kind(
    group="apiextensions.k8s.io",
    version="v1",
    kind="CustomResourceDefinition",
    plural="customresourcedefinitions",
    singular="customresourcedefinition",
    namespaced=False,
    schema=object_schema(
        f"{APIEXT}.CustomResourceDefinition",
        "Defines a new resource kind served by the API server.",
        CRD_SPEC,
        CRD_STATUS,
        required=("spec",),
    ),
    description="Defines a new resource kind served by the API server.",
    short_names=("crd", "crds"),
    categories=("api-extensions",),
    subresources=frozenset({"status"}),
    columns=(
        NAME,
        Column(
            "Created At",
            "date",
            "When the definition was created.",
            lambda o, n: str(get(o, "metadata.creationTimestamp", "")),
        ),
    ),
    validate=validate_crd,
    default=default_crd,
)
