"""``--max-json-depth`` reads the nesting off the body's text in one compiled pass
(``sparseserve.kernels.text.json_depth``): the same depth as a walk over the parsed value, for
any JSON, strings full of brackets, quotes and backslashes included."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparseserve.kernels.text import json_depth


def parsed_depth(value) -> int:
    """The reference: lists and objects nest one level each, down every branch."""
    if isinstance(value, dict):
        return 1 + max(map(parsed_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(parsed_depth, value), default=0)
    return 0


def depth_of(text: str | bytes) -> int:
    return json_depth(np.frombuffer(text.encode() if isinstance(text, str) else text, np.uint8))


# Strings drawn mostly from the bytes that matter to the scan.
tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\ aé\n\t/'), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=40)


@settings(max_examples=400, deadline=None)
@given(json_values, st.booleans())
def test_depth_of_the_text_is_the_depth_of_the_value(value, compact):
    text = json.dumps(value, separators=(",", ":") if compact else None, ensure_ascii=not compact)
    assert depth_of(text) == parsed_depth(value)


def test_brackets_in_strings_and_escapes():
    assert depth_of(b"") == depth_of(b"12") == depth_of(b'"[[["') == 0
    assert depth_of(b"[]") == depth_of(b"{}") == 1
    assert depth_of(rb'["\"[[", [1]]') == 2  # an escaped quote does not end the string
    assert depth_of(rb'["\\", [[1]]]') == 3  # an escaped backslash does not escape the quote
    assert depth_of(rb'{"a": {"b": [[], {"c": "]]]}"}]}}') == 4
    deep = "[" * 5000 + "]" * 5000
    assert depth_of(deep) == 5000
    assert depth_of("[0, " + deep + "]") == 5001  # a list's later items count too
