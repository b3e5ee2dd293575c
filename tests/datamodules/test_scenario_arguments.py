"""datamodules/scenario_arguments.py: build_scenario's argument checks return the checked value
and refuse a bad one by naming the argument and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fedcluster.datamodules.scenario_arguments import (
    check_tensors,
    corrupt_fractions_arg,
    corruptions_arg,
    image_shape_arg,
    preset_arg,
    preset_evaluation_fractions,
    proportions_arg,
    rows_as_images,
)
from lightning_fedcluster.datamodules.shifts import CORRUPTIONS


def test_preset_fractions_are_the_authors_split_unless_given():
    assert preset_evaluation_fractions("authors", None, None) == (0.1, 0.9)
    assert preset_evaluation_fractions(None, None, None) == (0.2, 0.4)
    assert preset_evaluation_fractions("authors", 0.3, None) == (0.3, 0.9)  # the user's value wins


def test_the_authors_preset_refuses_what_it_fixes():
    assert preset_arg(None, 5, None, None, None) is False
    assert preset_arg("authors", 3, 1.0, None, None) is True
    with pytest.raises(ValueError, match="preset must be None or 'authors', got 'paper'"):
        preset_arg("paper", 3, 1.0, None, None)
    with pytest.raises(ValueError, match="pass concepts=3"):
        preset_arg("authors", 4, 1.0, None, None)
    with pytest.raises(ValueError, match="concept_proportions and corrupt_fraction must be left unset"):
        preset_arg("authors", 3, 1.0, [0.5, 0.25, 0.25], 0.1)
    with pytest.raises(ValueError, match="pass a positive dirichlet_alpha"):
        preset_arg("authors", 3, None, None, None)


def test_corruptions_default_and_unknown_kinds():
    assert corruptions_arg(None) == CORRUPTIONS
    assert corruptions_arg([CORRUPTIONS[0]]) == (CORRUPTIONS[0],)
    with pytest.raises(ValueError, match="non-empty list of corruption names"):
        corruptions_arg("fog")
    with pytest.raises(ValueError, match=r"unknown kinds \['smudge'\]"):
        corruptions_arg(["smudge"])


def test_tensors_are_checked_and_returned_as_cpu_float32_and_long():
    x, y = check_tensors(torch.zeros(3, 2, dtype=torch.float64), torch.tensor([0, 1, 2], dtype=torch.int32))
    assert x.dtype == torch.float32 and y.dtype == torch.long and y.tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match=r"global_test y holds <U1 labels .* numpy.unique"):
        check_tensors(np.zeros((2, 2)), np.array(["a", "b"]), "global_test")
    with pytest.raises(TypeError, match=r"numpy arrays: torch.from_numpy"):
        check_tensors(np.zeros((2, 2)), np.array([0, 1]))
    with pytest.raises(TypeError, match=r"x must be floating point, got torch.int64; use x.float\(\)"):
        check_tensors(torch.zeros(2, 2, dtype=torch.long), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="regression targets"):
        check_tensors(torch.zeros(2, 2), torch.tensor([0.5, 1.0]))
    with pytest.raises(TypeError, match=r"y must hold integer class indices, got torch.float32; use y.long"):
        check_tensors(torch.zeros(2, 2), torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match=r"y must hold integer class indices, got torch.bool"):
        check_tensors(torch.zeros(2, 2), torch.tensor([True, False]))
    with pytest.raises(ValueError, match=r"x must have shape \[N, ...features\], got \(2,\)"):
        check_tensors(torch.zeros(2), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"one label per row of x \(2 rows, non-empty\), got shape \(3,\)"):
        check_tensors(torch.zeros(2, 2), torch.tensor([0, 1, 2]))


def test_concept_proportions_default_to_half_for_concept_zero_and_must_sum_to_one():
    assert proportions_arg(None, 3) == [0.5, 0.25, 0.25]
    assert proportions_arg(None, 1) == [1.0]
    assert proportions_arg([0.2, 0.8], 2) == [0.2, 0.8]
    with pytest.raises(ValueError, match="sequence of 3 numbers"):
        proportions_arg([0.5, 0.5], 3)
    with pytest.raises(ValueError, match="non-negative numbers"):
        proportions_arg([1.5, -0.5], 2)
    with pytest.raises(ValueError, match=r"must sum to 1, got \[0.5, 0.4\] \(sum 0.9\)"):
        proportions_arg([0.5, 0.4], 2)


def test_corrupt_fractions_default_to_the_papers_and_broadcast_one_number():
    assert corrupt_fractions_arg(None, 3) == [0.4, 0.2, 0.2]
    assert corrupt_fractions_arg(0.1, 2) == [0.1, 0.1]
    assert corrupt_fractions_arg([0.0, 0.3], 2) == [0.0, 0.3]
    with pytest.raises(ValueError, match="sequence of 3 such numbers"):
        corrupt_fractions_arg([0.1], 3)


def test_flat_rows_become_images_only_when_the_shape_fits():
    x = torch.arange(24.0).reshape(2, 12)
    assert rows_as_images(x, (3, 2, 2)).shape == (2, 3, 2, 2)
    assert rows_as_images(x, (1, 2, 2)) is x  # 4 values per image, 12 per row: left for the checks
    assert rows_as_images(x, None) is x


def test_image_shape_is_read_from_images_and_required_for_corrupted_flat_rows():
    assert image_shape_arg(None, torch.zeros(2, 1, 4, 4), needed=True) == (1, 4, 4)
    assert image_shape_arg(None, torch.zeros(2, 16), needed=False) == ()
    assert image_shape_arg([1, 4, 4], torch.zeros(2, 16), needed=True) == (1, 4, 4)
    with pytest.raises(
        ValueError, match=r"pass image_shape=\(channels, height, width\) or corrupt_fraction=0"
    ):
        image_shape_arg(None, torch.zeros(2, 16), needed=True)
    with pytest.raises(ValueError, match="positive integers"):
        image_shape_arg((1, 0, 16), torch.zeros(2, 16), needed=True)
    with pytest.raises(
        ValueError, match=r"image_shape=\(1, 3, 3\) has 9 values per sample .* fix image_shape"
    ):
        image_shape_arg((1, 3, 3), torch.zeros(2, 16), needed=True)
