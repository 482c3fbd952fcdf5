"""MRCR (§2.2): the conversation holds exactly the promised needles, near misses and filler; exactly one
writing is the answer; both published graders; the openai/mrcr loader on a small Parquet file."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longeval.errors import ConfigError, DataFileError, LengthError
from longeval.tasks.base import Draft, GenContext
from longeval.tasks.michelangelo import mrcr, prompts
from longeval.tasks.michelangelo.writings import (
    FEW_SHOT_TOPICS,
    WRITINGS_PER_KEY,
    load_openai_pool,
    parse_request,
    procedural_pool,
)
from tests.tasks.michelangelo.mich_helpers import SPECS, make

TURN = re.compile(r"User: Write an? (.+?) about (.+?)\.\nModel: (.*?)\n(?=User: |\Z)", re.DOTALL)


def _turns(d: Draft) -> list[tuple[str, str, str]]:
    """(format, topic, writing) of every turn of the task's conversation (after the examples)."""
    header = prompts.MRCR_EXAMPLE_HEADER.format(n=3)
    conversation = d.prompt[d.prompt.index(header) + len(header) : d.prompt.rindex("User: Add the sentence")]
    turns = TURN.findall(conversation)
    assert "".join(prompts.MRCR_TURN.format(request=mrcr.request(f, t), writing=w) for f, t, w in turns) == conversation
    return turns


@pytest.fixture(scope="module")
def instances(drafts: Callable[[str, int, int], list[Draft]]) -> list[Draft]:
    return drafts("mrcr", 4096, 6) + drafts("mrcr", 32768, 3)


def test_needles_near_misses_and_filler_are_counted_exactly(instances: list[Draft]) -> None:
    for d in instances:
        meta, turns = d.meta, _turns(d)
        key = (meta["format"], meta["topic"])
        needles = [w for f, t, w in turns if (f, t) == key]
        near = [(f, t) for f, t, _ in turns if (f == key[0]) != (t == key[1])]
        assert len(needles) == meta["needles"] == int(d.complexity.split("=")[1])
        assert len(set(needles)) == len(needles)  # every needle is a different writing
        assert len(near) == meta["near_misses"] == 4
        assert sum(1 for f, _ in near if f == key[0]) == 2  # half share the format, half the topic
        assert meta["filler_turns"] == len(turns) - len(needles) - len(near)
        assert meta["filler_turns"] > 0


def test_exactly_one_writing_is_the_answer_and_it_is_the_kth_needle(instances: list[Draft]) -> None:
    for d in instances:
        meta, turns = d.meta, _turns(d)
        needles = [w for f, t, w in turns if (f, t) == (meta["format"], meta["topic"])]
        assert needles[meta["ordinal"] - 1] == d.references[0]
        assert sum(1 for _, _, w in turns if w == d.references[0]) == 1
        assert 1 <= meta["ordinal"] <= meta["needles"]


def test_the_question_and_the_examples(instances: list[Draft]) -> None:
    few_shot = {t.name for t in FEW_SHOT_TOPICS}
    for d in instances:
        meta = d.meta
        question = prompts.MRCR_QUESTION.format(random_string=meta["random_string"],
                                                ordinal=prompts.ordinal(meta["ordinal"]), format=meta["format"],
                                                topic=meta["topic"])
        assert question in d.prompt
        assert d.prompt.rstrip().endswith(prompts.MRCR_CUE)
        assert re.fullmatch(r"[A-Za-z0-9]{10}", meta["random_string"])
        assert d.prompt.count(meta["random_string"]) == 1
        examples = d.prompt[: d.prompt.index(prompts.MRCR_EXAMPLE_HEADER.format(n=3))]
        assert examples.count("User: Add the sentence") == 2
        assert {t for _, t, _ in TURN.findall(examples + "User: ")} <= few_shot
        assert meta["topic"] not in few_shot


def test_needle_counts_cycle_with_the_index(instances: list[Draft]) -> None:
    assert [d.meta["needles"] for d in instances[:6]] == [2, 4, 8, 2, 4, 8]


def test_deepmind_grading_uses_a_12_character_hash(ctx: GenContext) -> None:
    params = mrcr.MrcrParams(grading="deepmind")
    d = make(ctx, SPECS["mrcr"], 8192, 1, params=params)
    assert len(d.meta["random_string"]) == 12 and d.meta["grading"] == "deepmind"
    assert mrcr.score_mrcr(f"{d.meta['random_string']} {d.references[0]}", d.references, d.meta).score == 1.0


def test_below_the_smallest_length_the_error_names_the_setting(ctx: GenContext) -> None:
    with pytest.raises(LengthError, match="suite.lengths"):
        make(ctx, SPECS["mrcr"], 2048, 0)


def test_params_are_checked() -> None:
    with pytest.raises(ConfigError):
        mrcr.MrcrParams(grading="anthropic")
    with pytest.raises(ConfigError):
        mrcr.MrcrParams(grading="deepmind", prefix_length=10)


def test_procedural_pool_writings_of_a_key_differ_substantially() -> None:
    pool = procedural_pool()
    assert pool.source == "procedural-v1"
    assert len(pool.formats) == 8 and len(pool.topics) == 16
    assert all(len(v) == WRITINGS_PER_KEY for v in pool.by_key.values())
    for key in [("poem", "penguins"), ("essay", "chess"), ("email", "jazz"), ("tweet", "trains")]:
        texts = [pool.writings[i].text for i in pool.by_key[key]]
        for a, b in zip(texts, texts[1:], strict=False):
            assert difflib.SequenceMatcher(None, a, b).ratio() < 0.8
    assert procedural_pool.__wrapped__().fingerprint == pool.fingerprint  # deterministic, not just cached


# -- the graders -----------------------------------------------------------------------------------

WRITING = "Ode to Penguins\n\nO hardy penguins of a rocky shore,\nyou dive into freezing water."
RS = "AKJSs89sal"
META = {"random_string": RS, "grading": "openai"}
META_DM = {"random_string": "AKJSs89salQ1", "grading": "deepmind"}


def test_openai_grader_by_hand() -> None:
    assert mrcr.grade_openai("abcXYZ", "abcXYW", "abc") == pytest.approx(2 * 2 / 6)
    assert mrcr.grade_openai("xabcXYZ", "abcXYZ", "abc") == 0.0
    assert mrcr.score_mrcr(f"{RS} {WRITING}", [WRITING], META).score == 1.0
    assert mrcr.score_mrcr(f"  {RS} {WRITING}", [WRITING], META).score == 1.0  # leading whitespace ignored
    missing = mrcr.score_mrcr(WRITING, [WRITING], META)
    assert (missing.score, missing.error_type) == (0.0, "no_prefix")
    late = mrcr.score_mrcr(f"Sure! {RS} {WRITING}", [WRITING], META)
    assert (late.score, late.error_type) == (0.0, "no_prefix")
    other = "Penguins are birds."
    partial = mrcr.score_mrcr(f"{RS} {other}", [WRITING], META)
    assert partial.score == pytest.approx(difflib.SequenceMatcher(None, f" {other}", f" {WRITING}").ratio())
    assert partial.error_type == "mismatch" and partial.parsed_answer == other


def test_deepmind_grader_by_hand() -> None:
    h = META_DM["random_string"]
    assert mrcr.grade_deepmind(f"  {h} {WRITING} ", f"{h} {WRITING}") == 1.0
    # the last occurrence of the hash starts the compared text
    assert mrcr.score_mrcr(f"I will write {h} then\n{h} {WRITING}", [WRITING], META_DM).score == 1.0
    assert mrcr.score_mrcr(f"Sure! {h} {WRITING}", [WRITING], META_DM).score == 1.0  # anywhere, unlike openai
    assert mrcr.score_mrcr(WRITING, [WRITING], META_DM).error_type == "no_prefix"
    assert mrcr.grade_deepmind("", f"{h} x") == 0.0
    assert mrcr.grade_deepmind("abc", "short") == 0.0
    expected = difflib.SequenceMatcher(a="hello world", b="hello there").ratio()
    assert mrcr.grade_deepmind(f"{h}hello there", f"{h} hello world") == pytest.approx(expected)


def test_noise_floors_are_recorded() -> None:
    assert mrcr.NOISE_FLOORS["same_key"] == {2: 0.51, 4: 0.27, 8: 0.15}
    assert mrcr.NOISE_FLOORS["any_response"] == 0.01
    assert mrcr.MrcrParams().grading == "openai"


# -- openai/mrcr Parquet files ---------------------------------------------------------------------


def _openai_file(folder: Path) -> Path:
    """A small file in openai/mrcr's layout: formats x topics x 10 writings spread over four rows."""
    rows = []
    for r in range(4):
        messages = [{"role": "user", "content": "Here are some examples of conversations ...\n\nUser: x"}]
        for fmt in ("poem", "short essay", "riddle"):
            for topic in ("tapirs", "rocks", "sailing"):
                for i in range(r * 3, r * 3 + 3):
                    messages.append({"role": "user", "content": f"write a {fmt} about {topic}"})
                    text = f"{fmt.title()} number {i} on {topic}: " + " ".join(f"w{i}x{j}" for j in range(30))
                    messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "Prepend abc to the 2nd (1 indexed) poem about tapirs."})
        rows.append({"prompt": json.dumps(messages), "answer": "abc...", "random_string_to_prepend": "abc",
                     "n_needles": 2, "desired_msg_index": 3, "total_messages": len(messages), "n_chars": 1})
    path = folder / "2needle" / "2needle_0.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_openai_pool_loader(tmp_path: Path, ctx: GenContext) -> None:
    _openai_file(tmp_path)
    pool = load_openai_pool(str(tmp_path), revision="test-rev")
    assert pool.source == "openai/mrcr@test-rev"
    assert set(pool.formats) == {"poem", "short essay", "riddle"}
    assert all(len(v) == 12 for v in pool.by_key.values())
    params = mrcr.MrcrParams(pool_path=str(tmp_path), pool_revision="test-rev", near_misses=2)
    d = make(ctx, SPECS["mrcr"], 8192, 2, params=params)
    assert d.meta["pool"] == "openai/mrcr@test-rev" and d.meta["needles"] == 8
    assert len(d.prompt_token_ids) + SPECS["mrcr"].max_new_tokens <= 8192
    assert d.prompt.count(d.references[0]) == 1


def test_openai_pool_needs_a_revision_and_a_real_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pool_revision"):
        load_openai_pool(str(tmp_path), revision="")
    with pytest.raises(DataFileError):
        load_openai_pool(str(tmp_path / "missing"), revision="r")
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(DataFileError):
        load_openai_pool(str(bad), revision="r")


def test_request_parsing() -> None:
    assert parse_request("write a poem about tapirs") == ("poem", "tapirs")
    assert parse_request("Write an email about the ocean.") == ("email", "the ocean")
    assert parse_request("write a social media post about rocks") == ("social media post", "rocks")
    assert parse_request("Prepend abc to the 2nd poem about tapirs") is None
