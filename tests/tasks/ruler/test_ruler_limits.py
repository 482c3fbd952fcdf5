"""Parameters past their limits fail at config time naming the limit, and generators that draw until a
condition holds give up after a bounded number of draws, naming the parameter: nothing hangs."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from longeval.config import load_config
from longeval.errors import ConfigError
from longeval.tasks.ruler import niah
from longeval.tasks.ruler.variable_tracking import draw_chains


@pytest.mark.parametrize(("override", "expected"), [
    ("+suite.params.vt.num_hops=100000",
     "suite.params: ruler/vt parameter num_hops=100000: num_chains x (num_hops + 1) = 100,001 variables need distinct "
     "names, but the in-context example's 3-letter names are only 17,576; use num_hops <= 17,575"),
    ("+suite.params.vt.num_hops=-1", "suite.params: ruler/vt parameter num_hops=-1: must be at least 0"),
])
def test_vt_parameters_past_their_limit_fail_at_config_time(override, expected):
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config(["suite.tasks=[vt]", override])
    assert str(info.value) == expected
    assert time.monotonic() - started < 30


def test_vt_name_drawing_gives_up_instead_of_drawing_forever():
    """31 distinct one-letter names cannot be drawn (params built without their dataclass check)."""
    params = SimpleNamespace(num_chains=1, num_hops=30)
    with pytest.raises(ConfigError, match="gave up drawing 31 distinct 1-letter variable names"):
        draw_chains(params, np.random.default_rng(0), 1)


def test_needle_drawing_gives_up_naming_the_parameter(monkeypatch):
    """Mock: `draw_many` always returns the same key, as a kind whose every key is taken would."""
    monkeypatch.setattr(niah, "draw_many", lambda kind, rng, n: ["same"] * n)
    with pytest.raises(ConfigError, match="gave up drawing 2 distinct words .*suite.params num_needle_k"):
        niah.draw_unique("words", np.random.default_rng(0), 2, set(), param="suite.params num_needle_k")


def test_plan_answers_at_once_for_an_absurd_sample_count(capsys, tmp_path):
    from longeval.cli import main

    started = time.monotonic()
    code = main(["plan", "suite.samples=100000000", f"store.root={tmp_path}"])
    text = " ".join(capsys.readouterr().out.split())
    assert code == 2
    assert ("error: suite.samples=100,000,000 makes 1,650,000,000 shards (11 tasks x 3 lengths, suite.shard_size=2); "
            "a plan holds at most 100,000: use suite.samples <= 6,060 or a larger suite.shard_size") in text
    assert time.monotonic() - started < 30


def test_fwe_parameters_past_their_limit_fail_at_config_time_and_the_vocabulary_is_bounded():
    from longeval.tasks.ruler.aggregation import FweParams, coded_vocab

    with pytest.raises(ConfigError, match="suite.params: ruler/fwe parameter coded_wordlen=1, vocab_per_tokens=50: "
                                          "coded_wordlen must be at least 2"):
        load_config(["suite.tasks=[fwe]", "+suite.params.fwe.coded_wordlen=1"])
    with pytest.raises(ConfigError, match="alpha=1.0: must be more than 1"):
        load_config(["suite.tasks=[fwe]", "+suite.params.fwe.alpha=1.0"])
    with pytest.raises(ConfigError, match="coded_wordlen=2 gives 676 distinct words, too few for a vocabulary of "
                                          "20,000"):
        coded_vocab(FweParams(coded_wordlen=2), 20_000, np.random.default_rng(0))  # 1M tokens // 50


def test_sync_word_drawing_refuses_more_words_than_half_the_space():
    from longeval.tasks.sync.translation import random_words

    with pytest.raises(ConfigError, match=r"word_length=\[1, 1\] gives 26 distinct words, too few for the 20"):
        random_words(20, (1, 1), np.random.default_rng(0))
