"""Patch labels: exact fractional coverage at grids that do not divide the mask."""

from __future__ import annotations

import numpy as np
import pytest

from bench.core.errors import ConfigError
from evaluators.tasks.issameobject.patch_labels import IGNORE, label_shares, patch_labels


def brute_force_shares(mask: np.ndarray, grid: tuple[int, int]) -> dict[int, np.ndarray]:
    """Oracle: replicate every pixel rows x cols times so patches have integer borders, then count."""
    rows, cols = grid
    big = np.repeat(np.repeat(mask, rows, axis=0), cols, axis=1)
    ph, pw = mask.shape[0], mask.shape[1]  # patch size in the replicated image
    out = {}
    for label in np.unique(mask):
        hit = (big == label).reshape(rows, ph, cols, pw).sum(axis=(1, 3))
        out[int(label)] = hit / (ph * pw)
    return out


def test_hand_computed_three_by_three_on_two_by_two():
    # patches are 1.5 x 1.5 px; patch (0,0) holds pixel (0,0) whole, (0,1) and (1,0) half, (1,1) a quarter
    mask = np.zeros((3, 3), np.uint8)
    mask[0, 0] = 1  # 1 / 2.25 = 0.444 of patch (0,0): the largest share, but not a majority
    mask[0, 1] = 2  # share (0,0): 0.5 / 2.25; share (0,1): 0.5 / 2.25
    mask[2, 2] = 3  # whole corner pixel: 1 / 2.25 of patch (1,1)
    ids, shares = label_shares(mask, (2, 2))
    assert ids.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(shares[1], [[1 / 2.25, 0], [0, 0]])
    np.testing.assert_allclose(shares[2], [[0.5 / 2.25, 0.5 / 2.25], [0, 0]])
    np.testing.assert_allclose(shares.sum(0), 1.0)
    # patch (0,0): label 1 0.444, label 2 0.222, background 0.333
    assert patch_labels(mask, (2, 2), min_share=0.0).tolist() == [[1, 0], [0, 0]]
    assert patch_labels(mask, (2, 2), min_share=0.5).tolist() == [[IGNORE, 0], [0, 0]]
    mask[1, 0] = 1  # now label 1 covers 1 + 0.5 = 1.5 / 2.25 = 0.667 of patch (0,0)
    assert patch_labels(mask, (2, 2), min_share=0.5).tolist() == [[1, 0], [0, 0]]


def test_uneven_five_by_seven_grid_exact_labels():
    # 12 x 17 mask: patches are 2.4 x 2.43 px, so every border cuts pixels
    mask = np.zeros((12, 17), np.uint8)
    mask[0:5, 0:5] = 1  # covers patch rows 0-1 (0..4.8) and cols 0-1 (0..4.86) fully, bits of row 2 / col 2
    mask[6:12, 10:17] = 2  # rows 6..12: patch row 2 (4.8..7.2) 1.2/2.4 = 0.5 of height
    mask[0:12, 8:9] = 3  # one-pixel column: at most 1/2.43 = 0.41 of a patch -> never a majority
    expected = np.array(
        [
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 2, 2, 2],
            [0, 0, 0, 0, 2, 2, 2],
            [0, 0, 0, 0, 2, 2, 2],
        ]
    )
    labels = patch_labels(mask, (5, 7), min_share=0.0)
    # patch (2, 4) spans cols 9.71..12.14: label 2 holds (12.14-10)/2.43 = 0.88 of width x 0.5 of height
    # = 0.44, label 3 none, background 0.56 -> background; patches (2,5), (2,6): 0.5 each -> tie -> 0
    expected[2, 4:] = 0
    np.testing.assert_array_equal(labels, expected)
    ids, shares = label_shares(mask, (5, 7))
    oracle = brute_force_shares(mask, (5, 7))
    for k, label in enumerate(ids):
        np.testing.assert_allclose(shares[k], oracle[int(label)], atol=1e-12)


def test_min_share_marks_ambiguous_patches_ignored():
    mask = np.zeros((6, 6), np.uint8)
    mask[:, 0:2], mask[:, 2:4], mask[:, 4:6] = 1, 2, 3  # one patch 6x6 split in three
    assert patch_labels(mask, (1, 1), min_share=0.5).tolist() == [[IGNORE]]
    assert patch_labels(mask, (1, 1), min_share=0.3).tolist() == [[1]]  # tie of thirds -> smallest id
    mask[:, 4:6] = 2
    assert patch_labels(mask, (1, 1), min_share=0.5).tolist() == [[2]]  # 2/3
    assert patch_labels(mask, (1, 1), min_share=0.7).tolist() == [[IGNORE]]


@pytest.mark.parametrize("grid", [(3, 4), (5, 7), (16, 16)])
def test_random_masks_match_brute_force(grid):
    rng = np.random.default_rng(sum(grid))
    mask = rng.integers(0, 4, size=(16, 16)).astype(np.uint8)
    ids, shares = label_shares(mask, grid)
    oracle = brute_force_shares(mask, grid)
    for k, label in enumerate(ids):
        np.testing.assert_allclose(shares[k], oracle[int(label)], atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ConfigError, match="min_share"):
        patch_labels(np.zeros((4, 4), np.uint8), (2, 2), min_share=1.5)
    with pytest.raises(ConfigError, match="grid"):
        patch_labels(np.zeros((4, 4), np.uint8), (0, 2))
