"""Chance rates (Appendix B) and the §3.2 stratification and bucket normalisation."""

from __future__ import annotations

import pytest

from longeval.tasks.michelangelo import chance, stratify
from longeval.tasks.michelangelo.idk import IdkParams
from longeval.tasks.michelangelo.mrcr import MrcrParams


def test_paper_chance_rates_are_recorded() -> None:
    assert chance.PAPER_CHANCE["latent_list"] == 0.122
    assert chance.PAPER_CHANCE["latent_list_by_complexity"] == {1: 0.169, 5: 0.113, 20: 0.085}
    assert (chance.PAPER_CHANCE["mrcr_any_writing"], chance.PAPER_CHANCE["mrcr_topic_or_format"]) == (0.04, 0.09)
    assert chance.idk_chance() == 0.25
    assert chance.idk_always_unknown() == 0.7 and chance.idk_always_unknown(IdkParams(unknown_per_10=5)) == 0.5


def test_latent_list_chance_is_deterministic_and_falls_with_complexity() -> None:
    rate = chance.latent_list_chance(samples=120, seed=1)
    assert rate == chance.latent_list_chance(samples=120, seed=1)
    assert 0.05 < rate.overall < 0.5
    assert rate.by_complexity[1] > rate.by_complexity[5] > rate.by_complexity[20]  # as the paper's 16.9/11.3/8.5
    assert rate.by_view["print"] < rate.by_view["sum"]  # exact match is hard to hit by chance


def test_mrcr_chance_orders_the_random_models() -> None:
    rates = {m: chance.mrcr_chance(model=m, samples=60, seed=2).overall for m in chance.MRCR_MODELS}
    assert rates["any"] < rates["related"] < rates["same_key"]
    same_key = chance.mrcr_chance(model="same_key", samples=90, seed=3).by_complexity
    assert same_key[2] > same_key[8]  # about 1/n plus the similarity of same-key writings
    assert 0.0 < chance.mrcr_chance(MrcrParams(grading="deepmind"), model="any", samples=30).overall < 0.3
    with pytest.raises(ValueError):
        chance.mrcr_chance(model="oracle")


def test_subsets_and_counts() -> None:
    assert stratify.length_grid("32k") == (4096, 8192, 16384, 32768)
    assert stratify.length_grid("1M", min_length=1024)[-1] == 1_048_576
    assert stratify.lengths_for("128k", 100) == [(4096, 17), (8192, 17), (16384, 17), (32768, 17), (65536, 16),
                                                 (131072, 16)]
    assert sum(c for _, c in stratify.lengths_for("1m", 1000)) == 1000
    assert stratify.lengths_for("32k", 2) == [(4096, 1), (8192, 1)]
    with pytest.raises(ValueError):
        stratify.length_grid("64k")


def test_bucket_weights_follow_the_papers_example() -> None:
    weights = stratify.bucket_weights([4096, 32768, 65536, 131072, 262144, 1_048_576, 2_097_152])
    assert weights == {4096: 1 / 3, 32768: 1 / 3, 65536: 1 / 2, 131072: 1 / 2, 262144: 1.0, 1_048_576: 1.0,
                       2_097_152: 1.0}
    assert stratify.bucket_weights([4096, 65536], ["32k", "128k"]) == {4096: 0.5, 65536: 1.0}
    assert stratify.bucket_weights([4096], ["1m"]) == {4096: 1.0}


def test_stacking_all_three_subsets_restores_the_profile_of_one() -> None:
    """Stacking the three subsets and weighting by bucket gives the same curve as the 1M subset alone
    when each length's scores are the same in every subset."""
    per_length = {4096: 1.0, 8192: 0.9, 32768: 0.8, 131072: 0.5, 1_048_576: 0.2}
    stacked: dict[int, list[float]] = {}
    for subset in stratify.ALL_SUBSETS:
        for length, score in per_length.items():
            if length <= stratify.SUBSETS[subset]:
                stacked.setdefault(length, []).extend([score] * 10)
    alone = {length: [score] * 10 for length, score in per_length.items()}
    weighted = stratify.cumulative_average(stacked)
    assert [x for x, _ in weighted] == sorted(per_length)
    assert [v for _, v in weighted] == pytest.approx([v for _, v in stratify.cumulative_average(alone, None)])
    unweighted = stratify.cumulative_average(stacked, None)
    assert unweighted[-1][1] > weighted[-1][1]  # without weights the short lengths count three times


def test_cumulative_and_pointwise_by_hand() -> None:
    scores = {8192: [0.0, 1.0], 4096: [1.0, 1.0]}
    assert stratify.pointwise_average(scores) == [(4096, 1.0), (8192, 0.5)]
    assert stratify.cumulative_average(scores, None) == [(4096, 1.0), (8192, 0.75)]
    assert stratify.cumulative_average({}, None) == []
