from hypothesis import given, settings
from _oracle import run, tf, to_tf
from helpers import assert_eq
from strategies import coo_tensors

@settings(max_examples=30, deadline=None)
@given(coo_tensors(duplicates=False, hybrid=False))
def test_to_dense_matches_tf(t):
    want = tf().sparse.to_dense(tf().sparse.reorder(to_tf(t)), validate_indices=False).numpy()
    got = run("to_dense", sp_input=t, validate_indices=False)
    assert_eq(got, want)
