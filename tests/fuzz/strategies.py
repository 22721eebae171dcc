"""Hypothesis strategies: any protobuf message from its descriptor, hostile text, malformed JSON."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

ODD_TEXT = [
    "", " ", "\x00", "a\x00b", "\u202e\u0627\u0644\u0639", "\U0001f600" * 3, "\ud7ff\ue000\ufffd", "\u0301" * 20,
    "../../../../etc/passwd", "/etc/shadow", "~/.ssh/id_rsa", "${HOME}", "$(id)", "`id`", "%s%s%n", "\r\n\r\n",
    "null", "true", "[]", "{}", "-1", "1e309", "NaN", "x" * 5000,
]
hostile_text = st.one_of(
    st.sampled_from(ODD_TEXT),
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=200),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), hostile_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=12,
)
malformed_json = st.one_of(
    st.sampled_from(["", "{", "}", "{'a': 1}", '{"a": }', "[1,", '{"a": NaN}', '{"a": 1e999}', "\x00{}",
                     '{"a": "\\ud800"}', "\ufeff{}", '{"a": 1, "a": 2}', "{" * 2000 + "}" * 2000]),
    st.text(max_size=60),
    json_values.map(json.dumps),
)
"""Text a caller might send as arguments: broken JSON, non-objects, objects of the wrong shape."""


def messages(descriptor: Descriptor, strings: st.SearchStrategy[str], depth: int = 2) -> st.SearchStrategy[Any]:
    """Any message of this type: each field set or not, at most one member of each oneof, enums in and
    out of range, nested messages to `depth`."""
    cls = _message_class(descriptor)

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        message = cls()
        chosen_oneofs = {o.name: draw(st.sampled_from([None, *o.fields])) for o in descriptor.oneofs}
        for f in descriptor.fields:
            oneof = f.containing_oneof
            if oneof is not None and chosen_oneofs[oneof.name] is not f:
                continue
            if oneof is None and not draw(st.booleans()):
                continue
            _set_field(message, f, draw, strings, depth)
        return message

    built: st.SearchStrategy[Any] = build()
    return built


def _message_class(descriptor: Descriptor) -> Any:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


def _set_field(message: Message, f: FieldDescriptor, draw: st.DrawFn, strings: st.SearchStrategy[str],
               depth: int) -> None:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        entries = draw(st.dictionaries(_scalar(key_f, strings), _scalar(value_f, strings), max_size=3))
        getattr(message, f.name).update(entries)
        return
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        if depth <= 0:
            return
        assert f.message_type is not None
        sub = messages(f.message_type, strings, depth - 1)
        if _repeated(f):
            getattr(message, f.name).extend(draw(st.lists(sub, max_size=2)))
        else:
            getattr(message, f.name).CopyFrom(draw(sub))
        return
    values = _scalar(f, strings)
    if _repeated(f):
        getattr(message, f.name).extend(draw(st.lists(values, max_size=4)))
    else:
        setattr(message, f.name, draw(values))


def _repeated(f: FieldDescriptor) -> bool:
    return bool(getattr(f, "is_repeated", False)) or getattr(f, "label", 0) == FieldDescriptor.LABEL_REPEATED


def _scalar(f: FieldDescriptor, strings: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return strings
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=300)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=64 if t == FieldDescriptor.TYPE_DOUBLE else 32)
    if t == FieldDescriptor.TYPE_ENUM:
        assert f.enum_type is not None
        return st.integers(min_value=-3, max_value=len(f.enum_type.values) + 3)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(min_value=0, max_value=2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(min_value=0, max_value=2**64 - 1)
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return st.integers(min_value=-(2**31), max_value=2**31 - 1)
    return st.integers(min_value=-(2**63), max_value=2**63 - 1)
