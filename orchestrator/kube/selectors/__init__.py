"""Label and field selectors, parsed and matched exactly like apimachinery does.

`labels`: label selector strings (`labels.Parse`) and metav1.LabelSelector objects;
`fields`: field selector strings (`fields.ParseSelector`). Pure code: no I/O, no clock; every
parsing or validation problem is an `ApiError` 400 with apimachinery's wording. Import the
public names from here.
"""

from __future__ import annotations

from orchestrator.kube.selectors.fields import (
    ALWAYS_SUPPORTED_FIELDS,
    FieldRequirement,
    FieldSelector,
    check_field_labels,
    escape_field_value,
    parse_field_selector,
)
from orchestrator.kube.selectors.labels import (
    DOES_NOT_EXIST,
    EQUALS,
    EXISTS,
    GREATER_THAN,
    IN,
    LESS_THAN,
    NOT_EQUALS,
    NOT_IN,
    LabelSelector,
    Requirement,
    from_label_selector_object,
    label_key_errors,
    label_value_errors,
    parse_label_selector,
    requirement,
    selector_from_set,
    selector_to_string,
    validate_label_selector_object,
)

__all__ = [
    "ALWAYS_SUPPORTED_FIELDS",
    "DOES_NOT_EXIST",
    "EQUALS",
    "EXISTS",
    "GREATER_THAN",
    "IN",
    "LESS_THAN",
    "NOT_EQUALS",
    "NOT_IN",
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "check_field_labels",
    "escape_field_value",
    "from_label_selector_object",
    "label_key_errors",
    "label_value_errors",
    "parse_field_selector",
    "parse_label_selector",
    "requirement",
    "selector_from_set",
    "selector_to_string",
    "validate_label_selector_object",
]
