"""Label and field selectors: grammar, normal form, matching, errors (apimachinery semantics)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.kube.errors import ApiError
from orchestrator.kube.selectors import (
    LabelSelector,
    check_field_labels,
    from_label_selector_object,
    parse_field_selector,
    parse_label_selector,
    selector_from_set,
    selector_to_string,
    validate_label_selector_object,
)

# --- label selectors: examples ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("", ""),
        ("   ", ""),
        ("a=b", "a=b"),
        ("a==b", "a=b"),
        ("a != b", "a!=b"),
        ("env in (prod, dev)", "env in (dev,prod)"),
        ("env notin (x)", "env notin (x)"),
        ("a", "a"),
        ("!a", "!a"),
        ("z=1,a,!m", "a,!m,z=1"),
        ("a=", "a="),
        ("a in ()", "a in ()"),
        ("a in (,x)", "a in (,x)"),
        ("a in (x,,y)", "a in (,x,y)"),
        ("k>5", "k>5"),
        ("example.com/app-name=My_value.1", "example.com/app-name=My_value.1"),
        ("in in (in, notin)", "in in (in,notin)"),
    ],
)
def test_parse_normal_form(text: str, normal: str) -> None:
    sel = parse_label_selector(text)
    assert str(sel) == normal
    assert parse_label_selector(str(sel)) == sel


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("", {}, True),
        ("a=b", {"a": "b"}, True),
        ("a=b", {"a": "c"}, False),
        ("a=b", {}, False),
        ("a!=b", {}, True),
        ("a!=b", {"a": "b"}, False),
        ("a in (x,y)", {"a": "y"}, True),
        ("a in (x,y)", {}, False),
        ("a notin (x,y)", {}, True),
        ("a notin (x,y)", {"a": "x"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": ""}, False),
        ("a=", {"a": ""}, True),
        ("a>5", {"a": "6"}, True),
        ("a>5", {"a": "5"}, False),
        ("a<5", {"a": "x"}, False),
        ("a<5", {}, False),
        ("a=b,c", {"a": "b"}, False),
        ("a=b,c", {"a": "b", "c": "d"}, True),
    ],
)
def test_matches_examples(text: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(text).matches(labels) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
        ("a=b=c", "found '=', expected: ',' or 'end of string'"),
        ("a,", "found '', expected: identifier after ','"),
        (",a", "found ',', expected: !, identifier, or 'end of string'"),
        ("a in b", "unable to parse requirement: found 'b' expected: '('"),
        ("!a=b", "unable to parse requirement: found 'a', expected: ',' or 'end of string'"),
        ("a in (b", "unable to parse requirement: found '', expected: ',' or ')'"),
        ("a in (,,)", "unable to parse requirement: found ')', expected: ',', or identifier"),
        ("a>x", "the value must be an integer"),
        ("-a=b", 'unable to parse requirement: key: Invalid value: "-a": name part must'),
        ("a=-b", 'unable to parse requirement: values[0][a]: Invalid value: "-b"'),
        ("a/b/c", "a qualified name must consist of"),
        ("Ex.com/a", "prefix part a lowercase RFC 1123 subdomain"),
        ("a=" + "x" * 64, "must be no more than 63 characters"),
    ],
)
def test_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_label_selector(text)
    assert info.value.code == 400
    assert info.value.reason == "BadRequest"
    assert message in info.value.message


def test_nothing_and_everything() -> None:
    assert LabelSelector.everything().matches({"a": "b"})
    assert not LabelSelector.nothing().matches({})
    assert selector_from_set({"b": "2", "a": "1"}) == parse_label_selector("a=1,b=2")


# --- metav1.LabelSelector objects ----------------------------------------------------------------


def test_label_selector_object() -> None:
    obj = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["b", "a"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "env", "operator": "Exists"},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
        ],
    }
    sel = from_label_selector_object(obj)
    assert selector_to_string(obj) == "app=web,!canary,env,tier in (a,b),zone notin (x)"
    assert sel.matches({"app": "web", "tier": "a", "env": "1"})
    assert not sel.matches({"app": "web", "tier": "a", "env": "1", "canary": "y"})
    assert selector_to_string({}) == ""
    assert from_label_selector_object({}).matches({"any": "thing"})
    assert not from_label_selector_object(None).matches({})


def test_label_selector_object_errors() -> None:
    obj = {
        "matchLabels": {"ok": "-bad"},
        "matchExpressions": [
            {"key": "a", "operator": "In"},
            {"key": "b", "operator": "Exists", "values": ["x"]},
            {"key": "c", "operator": "Gt", "values": ["1"]},
            {"operator": "Exists"},
        ],
    }
    fields = [c.field for c in validate_label_selector_object(obj, "spec.selector")]
    assert fields == [
        "spec.selector.matchLabels",
        "spec.selector.matchExpressions[0].values",
        "spec.selector.matchExpressions[1].values",
        "spec.selector.matchExpressions[2].operator",
        "spec.selector.matchExpressions[3].key",
    ]
    with pytest.raises(ApiError) as info:
        from_label_selector_object(obj)
    assert info.value.code == 400
    assert len(info.value.details["causes"]) == 5


# --- field selectors ---------------------------------------------------------------------------


def test_field_selector() -> None:
    sel = parse_field_selector("spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed")
    running = {"spec.nodeName": "n1", "status.phase": "Running"}
    failed = {"spec.nodeName": "n1", "status.phase": "Failed"}
    empty: dict[str, str] = {}
    assert sel.matches(running.get)
    assert not sel.matches(failed.get)
    assert not sel.matches(empty.get)
    assert sel.exact("spec.nodeName") == "n1"
    assert sel.exact("status.phase") is None
    assert parse_field_selector("metadata.name==x").requirements[0].operator == "="
    assert parse_field_selector("").empty()
    assert parse_field_selector("a=").matches(empty.get)


def test_field_selector_escaping() -> None:
    sel = parse_field_selector(r"metadata.name=a\,b\=c\\d")
    assert sel.exact("metadata.name") == "a,b=c\\d"
    assert parse_field_selector(str(sel)) == sel


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a", "invalid selector: 'a'; can't understand 'a'"),
        ("a=b=c", "invalid field selector: unescaped character in value: ="),
        (r"a=b\x", r"invalid field selector: invalid escape sequence: \x"),
        ("a=b\\", "invalid field selector: invalid escape sequence: \\"),
    ],
)
def test_field_selector_errors(text: str, message: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_field_selector(text)
    assert info.value.code == 400
    assert info.value.message == message


def test_check_field_labels() -> None:
    check_field_labels(parse_field_selector("metadata.name=a,metadata.namespace=b"), set())
    check_field_labels(parse_field_selector("spec.nodeName=a"), {"spec.nodeName"})
    with pytest.raises(ApiError) as info:
        check_field_labels(parse_field_selector("spec.bogus=a"), {"spec.nodeName"})
    assert info.value.code == 400
    assert info.value.message == "field label not supported: spec.bogus"


# --- properties -------------------------------------------------------------------------------

KEYS = ["a", "b", "x.io/c"]
VALUES = ["", "1", "7", "v", "w"]
_ops = st.sampled_from(["exists", "!", "=", "==", "!=", "in", "notin", ">", "<"])


@st.composite
def requirements(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    key = draw(st.sampled_from(KEYS))
    op = draw(_ops)
    if op in ("exists", "!"):
        return key, op, []
    if op in ("in", "notin"):
        # No "" here: apimachinery itself rejects `(,,)` (tested as an example instead).
        return key, op, draw(st.lists(st.sampled_from(VALUES[1:]), min_size=1, max_size=3))
    if op in (">", "<"):
        return key, op, [draw(st.sampled_from(["0", "1", "7"]))]
    return key, op, [draw(st.sampled_from(VALUES))]


def render(reqs: list[tuple[str, str, list[str]]], sp: str) -> str:
    parts = []
    for key, op, vals in reqs:
        if op == "exists":
            parts.append(key)
        elif op == "!":
            parts.append(f"!{sp}{key}")
        elif op in ("in", "notin"):
            parts.append(f"{key} {op}{sp}({sp}{(sp + ',' + sp).join(vals)}{sp})")
        else:
            parts.append(f"{key}{sp}{op}{sp}{vals[0]}")
    return (sp + "," + sp).join(parts)


def reference(reqs: list[tuple[str, str, list[str]]], labels: dict[str, str]) -> bool:
    for key, op, vals in reqs:
        v = labels.get(key)
        ok = {
            "exists": v is not None,
            "!": v is None,
            "=": v == vals[0] if vals else False,
            "==": v == vals[0] if vals else False,
            "!=": v != vals[0] if vals else False,
            "in": v in vals,
            "notin": v not in vals,
        }.get(op)
        if ok is None:  # > and <
            try:
                n = int(v) if v is not None else None
            except ValueError:
                n = None
            ok = n is not None and (n > int(vals[0]) if op == ">" else n < int(vals[0]))
        if not ok:
            return False
    return True


label_maps = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(requirements(), max_size=4),
    st.sampled_from(["", " ", "  \t"]),
    st.lists(label_maps, min_size=1, max_size=5),
)
def test_matches_agrees_with_reference(
    reqs: list[tuple[str, str, list[str]]], sp: str, maps: list[dict[str, str]]
) -> None:
    text = render(reqs, sp)
    sel = parse_label_selector(text)
    assert parse_label_selector(str(sel)) == sel
    for labels in maps:
        assert sel.matches(labels) == reference(reqs, labels), (text, labels)


_alphabet = st.sampled_from([*"ab1=!(),<> \t/.-_xinotIN\\", "in", "notin", "é", "\x00"])


@settings(max_examples=500, deadline=None)
@given(st.lists(_alphabet, max_size=20).map("".join))
def test_random_label_text_only_raises_api_error(text: str) -> None:
    try:
        sel = parse_label_selector(text)
    except ApiError as e:
        code = e.code
    else:
        code = 200
        assert parse_label_selector(str(sel)) == sel
    assert code in (200, 400)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_any_text_only_raises_api_error(text: str) -> None:
    codes = []
    try:
        sel = parse_label_selector(text)
    except ApiError as e:
        codes.append(e.code)
    else:
        assert parse_label_selector(str(sel)) == sel
    try:
        fsel = parse_field_selector(text)
    except ApiError as e:
        codes.append(e.code)
    else:
        assert parse_field_selector(str(fsel)) == fsel
    assert set(codes) <= {400}
