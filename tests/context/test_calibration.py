"""What the upstream's usage teaches: the ratio of its count to ours, and apart from it the sealed blobs' scale."""

from __future__ import annotations

import pytest

from proxy.context.calibration import SEALED_BOUNDS, Calibration

MODEL = "gpt-5.1-codex"


def bill(rest: int, sealed: int, *, ratio: float = 1.03, scale: float = 3.0) -> int:
    """What an upstream that counts text at `ratio` of ours and a blob at `scale` of our estimate bills."""
    return round(ratio * rest + scale * sealed)


def test_the_sealed_scale_is_learned_once_edits_move_the_mix_and_the_ratio_follows_the_text() -> None:
    calibration = Calibration()
    # Unedited turns: text and blobs grow together, so one ratio explains them and no scale is learned.
    for turn in range(1, 6):
        rest, sealed = 4000 * turn, 100 * turn
        calibration.learn(MODEL, bill(rest, sealed), rest + sealed, (sealed, sealed))
    assert calibration.sealed_scale(MODEL) == 1.0
    # Edits clear text, so later requests hold mostly blobs: the two counts now vary apart.
    for rest, sealed in ((9000, 700), (12000, 800), (7000, 900), (15000, 1000), (8000, 1100)):
        scale = calibration.sealed_scale(MODEL)
        counted = round(sealed * scale)
        calibration.learn(MODEL, bill(rest, sealed), rest + counted, (counted, sealed))
    assert calibration.sealed_scale(MODEL) == pytest.approx(3.0, rel=0.05)
    # Counted at that scale, the text is all the ratio still has to correct.
    for _ in range(10):
        calibration.learn(MODEL, bill(9000, 1200), 9000 + 3.0 * 1200, (3600, 1200))
    assert calibration.ratio(MODEL) == pytest.approx(1.03, rel=0.02)


def test_a_blob_the_upstream_does_not_bill_drives_the_scale_to_its_floor_not_below() -> None:
    calibration = Calibration()
    for rest, sealed in ((9000, 700), (12000, 900), (7000, 900), (15000, 1000), (8000, 1200)):
        calibration.learn(MODEL, bill(rest, sealed, scale=0.0), rest + sealed, (sealed, sealed))
    assert calibration.sealed_scale(MODEL) == SEALED_BOUNDS[0]


def test_a_request_without_blobs_teaches_no_scale() -> None:
    calibration = Calibration()
    for rest in (9000, 12000, 7000):
        calibration.learn(MODEL, bill(rest, 0), rest)
    assert calibration.sealed_scale(MODEL) == 1.0 and MODEL not in calibration.scales
