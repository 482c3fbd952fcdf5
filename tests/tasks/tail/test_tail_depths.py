"""Gold segments at depths, the preceding-segment fall-back, and depth checks."""

from __future__ import annotations

import pytest

from longeval.errors import ConfigError, DataFileError
from longeval.tasks.tail import DEFAULT_DEPTHS, check_depths, initial_segments, previous_segment, segment_at_depth


def test_default_depths_are_5_to_95_percent() -> None:
    assert DEFAULT_DEPTHS[0] == 0.05 and DEFAULT_DEPTHS[-1] == 0.95 and len(DEFAULT_DEPTHS) == 19
    assert all(abs(b - a - 0.05) < 1e-9 for a, b in zip(DEFAULT_DEPTHS, DEFAULT_DEPTHS[1:], strict=False))


def test_segment_at_depth_holds_the_word_at_that_depth() -> None:
    counts = [600, 600, 600, 600, 100]  # 2500 words
    assert segment_at_depth(counts, 0.0) == 0
    assert segment_at_depth(counts, 0.239) == 0  # word 597
    assert segment_at_depth(counts, 0.24) == 1  # word 600 starts segment 1
    assert segment_at_depth(counts, 0.5) == 2  # word 1250
    assert segment_at_depth(counts, 0.96) == 4  # word 2400, in the short last segment
    assert segment_at_depth(counts, 1.0) == 4
    with pytest.raises(ValueError):
        segment_at_depth([], 0.5)


def test_previous_segment_skips_taken_ones() -> None:
    assert previous_segment(5) == 4
    assert previous_segment(5, taken={4, 3}) == 2
    assert previous_segment(0) is None
    assert previous_segment(2, taken={0, 1}) is None


def test_initial_segments_never_share_a_segment() -> None:
    counts = [600] * 4
    assert initial_segments(counts, [0.1, 0.4, 0.6, 0.9]) == (0, 1, 2, 3)
    # 0.55 and 0.6 both fall in segment 2: the second moves to the free segment before it
    assert initial_segments(counts, [0.55, 0.6]) == (2, 1)
    # nothing free before segment 0: move forward
    assert initial_segments(counts, [0.01, 0.02]) == (0, 1)
    with pytest.raises(DataFileError, match=r"domain 'tiny' has 4 segment\(s\).*5 depths"):
        initial_segments(counts, [0.1, 0.3, 0.5, 0.7, 0.9], domain="tiny")


def test_check_depths() -> None:
    assert check_depths([0.5, 0.05]) == (0.5, 0.05)
    with pytest.raises(ConfigError, match="fractions"):
        check_depths([5, 50])
    with pytest.raises(ConfigError, match="repeats"):
        check_depths([0.5, 0.5])
    with pytest.raises(ConfigError, match="empty"):
        check_depths([])
