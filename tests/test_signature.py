"""A streaming model's state in the signature: pairs checked against the tensors, their starting
values against the dtype, and the manifest's form read back."""

from __future__ import annotations

import numpy as np
import pytest

from unideploy.errors import InputError
from unideploy.signature import Signature, StateSpec, TensorSpec, parse_state

STREAM = Signature(
    (
        TensorSpec("x", "float32", ("batch", 4)),
        TensorSpec("h", "float32", (2, "batch", 8)),
        TensorSpec("k", "int8", (3,)),
    ),
    (
        TensorSpec("y", "float32", ("batch", 1)),
        TensorSpec("hn", "float32", (2, "batch", 8)),
        TensorSpec("kn", "int8", (3,)),
    ),
)


def test_state_pairs_are_checked_against_the_models_tensors():
    state = STREAM.with_state((StateSpec("h", "hn"), StateSpec("k", "kn", -128)))
    assert Signature.from_dict(state.to_dict()) == state and "state" not in STREAM.to_dict()
    assert state.initial_state(state.state[0], 3).shape == (2, 3, 8)
    np.testing.assert_array_equal(state.initial_state(state.state[1], 1), np.full(3, -128, np.int8))
    for pairs, words in [
        ((StateSpec("nope", "hn"),), "state input 'nope' is not an input"),
        ((StateSpec("h", "nope"),), "state output 'nope' .* is not an output"),
        ((StateSpec("h", "y"),), "cannot take output 'y' float32 \\[batch, 1\\] back"),
        ((StateSpec("h", "hn"), StateSpec("h", "hn")), "given twice"),
        ((StateSpec("k", "kn", 200),), "\\(int8\\) cannot start from 200"),
        ((StateSpec("k", "kn", 0.5),), "cannot start from 0.5"),
    ]:
        with pytest.raises(InputError, match=words):
            STREAM.with_state(pairs)


def test_state_flags_are_parsed_with_their_starting_value():
    assert parse_state("state=stateN") == StateSpec("state", "stateN", 0.0)
    assert parse_state("h0=hn:-128") == StateSpec("h0", "hn", -128.0)
    for bad in ("state", "=x", "a=b:zero", "a=b:inf"):
        with pytest.raises(InputError, match="bad --state"):
            parse_state(bad)


def test_a_state_whose_size_only_the_caller_knows_is_refused_a_start():
    """A dynamic dim other than the batch: no starting value can be made for it."""
    signature = Signature(
        (TensorSpec("h", "float32", ("batch", "time")), TensorSpec("x", "float32", ("batch", 2))),
        (TensorSpec("hn", "float32", ("batch", "time")),),
    ).with_state((StateSpec("h", "hn"),))
    with pytest.raises(InputError, match="dynamic dimension 'time'"):
        signature.initial_state(signature.state[0], 1)


def test_values_past_a_table_are_refused_naming_the_input_but_not_where_still_unread():
    """An input whose values index a table of the model's (``table_rows``) is checked on its values:
    ONNX's -rows to rows - 1; any other integer is refused naming the input and the value. An input
    still in a client's shared memory (``unread``, checked on a stand-in whose bytes are not its
    own) is checked on its shape and dtype only; a float input carries no table."""
    from unideploy.errors import RefusedValues

    sig = Signature(
        (TensorSpec("ids", "int64", ("batch", 4)), TensorSpec("x", "float32", ("batch", 4)))
    ).with_table_rows({"ids": 10, "x": 10})
    assert [t.table_rows for t in sig.inputs] == [10, None]
    assert TensorSpec.from_dict(sig.inputs[0].to_dict()) == sig.inputs[0]
    x = np.zeros((1, 4), np.float32)
    sig.validate_inputs({"ids": np.array([[0, 9, -10, -1]]), "x": x})
    with pytest.raises(RefusedValues, match=r"input 'ids' holds -11, past the 10 rows of the table"):
        sig.validate_inputs({"ids": np.array([[0, 9, -11, 10]]), "x": x})
    sig.validate_inputs({"ids": np.full((1, 4), 99), "x": x}, unread=["ids"])
