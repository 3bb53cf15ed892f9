"""Optimization profiles derived from signatures and --trt-profile: pure logic, no GPU needed."""

from __future__ import annotations

import numpy as np
import pytest

from unideploy.errors import InputError
from unideploy.runtimes.tensorrt.profiles import DEFAULT_BATCH, build_profiles, parse_profile
from unideploy.runtimes.tensorrt.spec import check_shapes
from unideploy.signature import Signature, TensorSpec

IMAGES = Signature((TensorSpec("x", "float32", ("batch", 3, 32, 32)),), (TensorSpec("y", "float32", ("batch", 10)),))
TOKENS = Signature(
    (TensorSpec("ids", "int64", ("batch", "seq")), TensorSpec("mask", "float32", ("batch", "seq"))),
    (TensorSpec("logits", "float32", ("batch", 2)),),
)


def test_a_dynamic_batch_alone_gets_the_default_range_and_fixed_dims_stay_fixed():
    (profile,) = build_profiles(IMAGES)
    assert (profile.min, profile.opt, profile.max) == (
        (DEFAULT_BATCH[0], 3, 32, 32),
        (DEFAULT_BATCH[1], 3, 32, 32),
        (DEFAULT_BATCH[2], 3, 32, 32),
    )
    static = Signature((TensorSpec("x", "float32", (4, 3, 32, 32)),))
    (fixed,) = build_profiles(static)
    assert fixed.min == fixed.opt == fixed.max == (4, 3, 32, 32)


def test_the_default_batch_range_goes_on_each_inputs_batch_axis():
    """Recurrent state laid out as [layers, batch, hidden] (Silero VAD's) has the batch at axis 1:
    it gets the default range there, as the audio chunk does at axis 0 (it needed a --trt-profile
    of its own, as if its batch were another dimension)."""
    vad = Signature(
        (TensorSpec("input", "float32", ("batch", 576)), TensorSpec("state", "float32", (2, "batch", 128))),
    )
    chunk, state = build_profiles(vad)
    assert (chunk.min, chunk.max) == ((DEFAULT_BATCH[0], 576), (DEFAULT_BATCH[2], 576))
    assert (state.min, state.opt, state.max) == tuple((2, b, 128) for b in DEFAULT_BATCH)


def test_other_dynamic_dims_need_a_range_and_the_message_shows_how_to_give_it():
    with pytest.raises(InputError, match=r"'seq'.*needs a range") as info:
        build_profiles(TOKENS)
    assert "--trt-profile ids:MIN,OPT,MAX" in info.value.hint


def test_given_ranges_are_used_and_one_shape_means_a_fixed_profile():
    ids, mask = build_profiles(TOKENS, ["ids:1x8,4x64,16x128", "mask:1x8,4x64,16x128"])
    assert (ids.min, ids.opt, ids.max) == ((1, 8), (4, 64), (16, 128))
    assert mask.to_dict() == {"min": [1, 8], "opt": [4, 64], "max": [16, 128]}
    assert parse_profile("x:2x3") == ("x", ((2, 3), (2, 3), (2, 3)))


@pytest.mark.parametrize(
    "given, message",
    [
        (["ids"], "not NAME:MIN,OPT,MAX"),
        (["ids:1xa,2x2,3x3"], "not whole numbers"),
        (["ids:1x8,4x64"], "needs 1 or 3 shapes"),
        (["ids:1x8x2,4x64x2,16x128x2", "mask:1x8,4x64,16x128"], "rank 3"),
        (["ids:4x64,1x8,16x128", "mask:4x64,1x8,16x128"], "min <= opt <= max"),
        (["ids:0x8,4x64,16x128", "mask:0x8,4x64,16x128"], "at least 1"),
        (["nope:1x1"], "unknown input"),
    ],
)
def test_bad_profiles_are_refused_with_the_reason(given, message):
    with pytest.raises(InputError, match=message):
        build_profiles(TOKENS, given)


def test_a_profile_cannot_change_a_fixed_dimension():
    with pytest.raises(InputError, match="dimension 1 is fixed at 3"):
        build_profiles(IMAGES, ["x:1x4x32x32,8x4x32x32,32x4x32x32"])


def test_inputs_sharing_a_dimension_must_agree_on_its_range():
    with pytest.raises(InputError, match=r"dimension 'seq' is 8/64/128 .* for 'ids' but 8/64/256 for 'mask'"):
        build_profiles(TOKENS, ["ids:1x8,4x64,16x128", "mask:1x8,4x64,16x256"])


def test_inputs_outside_the_profile_are_refused_before_they_reach_an_engine():
    profiles = tuple(build_profiles(IMAGES))
    check_shapes(profiles, {"x": np.zeros((32, 3, 32, 32), np.float32)})
    with pytest.raises(InputError, match=r"shape \[33, 3, 32, 32\], outside .*max \[32, 3, 32, 32\]") as info:
        check_shapes(profiles, {"x": np.zeros((33, 3, 32, 32), np.float32)})
    assert "--trt-profile x:MIN,OPT,33x3x32x32" in info.value.hint
