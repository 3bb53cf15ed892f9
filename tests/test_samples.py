"""Reference batches: which one holds the user's own sizes."""

from __future__ import annotations

import numpy as np

from unideploy.samples import example_batches, widest
from unideploy.signature import Signature, TensorSpec


def test_the_widest_batch_is_the_users_example_not_its_crop():
    """example_batches puts the batch with fewer rows first: a 256-row example's one-row crop (544
    samples instead of 576) comes before it; sizes for a fixed-size conversion are the example's."""
    signature = Signature((TensorSpec("input", "float32", ("batch", "samples")),))
    example = {"input": np.zeros((256, 576), np.float32)}
    crop, full = example_batches(example, signature)
    assert crop["input"].shape == (1, 544) and full["input"].shape == (256, 576)
    assert widest([crop, full], signature) is full


def test_without_dynamic_sizes_the_first_batch_is_taken():
    signature = Signature((TensorSpec("x", "float32", ("batch", 4)),))
    first, second = {"x": np.zeros((1, 4))}, {"x": np.zeros((8, 4))}
    assert widest([first, second], signature) is first
