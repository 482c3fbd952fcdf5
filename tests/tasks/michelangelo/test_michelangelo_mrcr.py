"""MRCR (§2.2): the conversation holds exactly the promised needles, near misses and filler; exactly one
writing is the answer; both published graders; the openai/mrcr loader on a small Parquet file."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longeval.errors import ConfigError, DataFileError, LengthError
from longeval.records import Prediction
from longeval.scoring import score_prediction
from longeval.tasks.base import Draft, GenContext, make_instance
from longeval.tasks.michelangelo import mrcr, prompts
from longeval.tasks.michelangelo.writings import (
    FEW_SHOT_TOPICS,
    WRITINGS_PER_KEY,
    load_openai_pool,
    parse_request,
    procedural_pool,
)
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder
from tests.tasks.michelangelo.mich_helpers import SPECS, make

TURN = re.compile(r"User: Write an? (.+?) about (.+?)\.\nModel: (.*?)\n(?=User: |\Z)", re.DOTALL)


def _turns(d: Draft) -> list[tuple[str, str, str]]:
    """(format, topic, writing) of every turn of the task's conversation (after the examples)."""
    header = prompts.MRCR_EXAMPLE_HEADER.format(n=3)
    conversation = d.prompt[d.prompt.index(header) + len(header) : d.prompt.rindex("User: Add the sentence")]
    turns = TURN.findall(conversation)
    assert "".join(prompts.MRCR_TURN.format(request=mrcr.request(f, t), writing=w) for f, t, w in turns) == conversation
    return turns


TEXT = mrcr.MrcrParams(layout="text")


@pytest.fixture(scope="module")
def instances(ctx: GenContext) -> list[Draft]:
    """Text-layout instances (Appendix A.2): the conversation as lines inside one user message."""
    return [make(ctx, SPECS["mrcr"], n, i, params=TEXT) for n, k in ((4096, 6), (32768, 3)) for i in range(k)]


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
    spaced = mrcr.score_mrcr(f" {RS} {WRITING}", [WRITING], META)  # the card's grade: raw output, no strip
    assert (spaced.score, spaced.error_type) == (0.0, "no_prefix")
    assert mrcr.grade_openai(f" {RS}{WRITING}", f"{RS}{WRITING}", RS) == 0.0
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


# -- the chat layout: openai/mrcr as published ------------------------------------------------------


def _messages(d: Draft, preamble: str | None) -> list[dict[str, str]]:
    """The instance's conversation as chat messages, rebuilt from its own turns and meta."""
    conversation = [m for f, t, w in _chat_turns(d) for m in (
        {"role": "user", "content": f"write {prompts.article(f)} {f} about {t}"},
        {"role": "assistant", "content": w})]
    head = [{"role": "user", "content": preamble}] if preamble else []
    return [*head, *conversation, {"role": "user", "content": d.meta["question"]}]


CHAT_TURN = re.compile(r"<\|im_start\|>user\nwrite an? (.+?) about (.+?)<\|im_end\|>\n<\|im_start\|>assistant\n"
                       r"(.*?)<\|im_end\|>\n", re.DOTALL)


def _chat_turns(d: Draft) -> list[tuple[str, str, str]]:
    return CHAT_TURN.findall(d.prompt[d.prompt.index("<|im_start|>user\nwrite ") :])


def test_chat_layout_is_the_models_chat_template_over_the_messages(ctx: GenContext, encoder: Encoder) -> None:
    """The multi-turn prompt equals apply_chat_template(messages) over the same turns, token for token,
    and input + output budget fits the target length."""
    for length, index in ((4096, 0), (8192, 2)):
        d = make(ctx, SPECS["mrcr"], length, index)
        meta = d.meta
        assert meta["layout"] == "chat" and meta["answer_joiner"] == "" and d.answer_prefix == ""
        assert meta["question"] == (f"Prepend {meta['random_string']} to the {prompts.ordinal(meta['ordinal'])} "
                                    f"(1 indexed) {meta['format']} about {meta['topic']}. "
                                    "Do not include any other text in your response.")
        preamble = mrcr.chat_examples(procedural_pool(), 10)
        messages = _messages(d, preamble)
        assert len(messages) > 20
        expected = encoder.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert d.prompt == expected
        ids = encoder.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        assert list(d.prompt_token_ids) == list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert length - SPECS["mrcr"].max_new_tokens - 200 <= len(d.prompt_token_ids)
        assert len(d.prompt_token_ids) + SPECS["mrcr"].max_new_tokens <= length
        needles = [w for f, t, w in _chat_turns(d) if (f, t) == (meta["format"], meta["topic"])]
        assert needles[meta["ordinal"] - 1] == d.references[0] and len(needles) == meta["needles"]


def test_chat_layout_for_a_base_model_is_a_plain_transcript(encoder: Encoder) -> None:
    base = GenContext(encoder=encoder, fmt=PromptFormat(chat_template=False))
    d = make(base, SPECS["mrcr"], 4096, 1)
    assert d.prompt.startswith("User:\nHere are some examples") and d.prompt.endswith("\n\nAssistant:\n")
    assert f"\n\nUser:\n{d.meta['question']}\n\nAssistant:\n" in d.prompt
    assert list(d.prompt_token_ids) == encoder.tokenizer.encode(d.prompt, add_special_tokens=False)
    assert len(d.prompt_token_ids) + SPECS["mrcr"].max_new_tokens <= 4096


def test_chat_layout_with_an_openai_pool_shows_its_messages_as_published(tmp_path: Path, ctx: GenContext,
                                                                          encoder: Encoder) -> None:
    _openai_file(tmp_path)
    params = mrcr.MrcrParams(pool_path=str(tmp_path), pool_revision="test-rev", near_misses=2, grading="deepmind")
    d = make(ctx, SPECS["mrcr"], 8192, 0, params=params)
    assert d.meta["layout"] == "chat"  # an openai/mrcr pool is run as published whatever the grader
    pool = load_openai_pool(str(tmp_path), revision="test-rev")
    assert pool.preamble.startswith("Here are some examples of conversations")
    expected = encoder.tokenizer.apply_chat_template(_messages(d, pool.preamble), tokenize=False,
                                                     add_generation_prompt=True)
    assert d.prompt == expected
    rs = d.meta["random_string"]
    assert mrcr.score_mrcr(f"{rs}{d.references[0]}", d.references, d.meta).score == 1.0


def test_the_grader_gets_the_raw_output_through_score_prediction(ctx: GenContext) -> None:
    """score_prediction strips outputs for RULER's metrics, but MRCR's graders see them as they came."""
    spec = SPECS["mrcr"]
    d = make(ctx, spec, 4096, 0)
    inst = make_instance(spec, d, ctx, target_length=4096, seed=1, shard_index=0, index=0)
    rs = d.meta["random_string"]

    def scored(output: str) -> float:
        return score_prediction(inst, Prediction(inst.instance_id, "m", output, 1, "stop", 0, 0.0), spec.judge).score

    assert scored(f"{rs}{d.references[0]}") == 1.0
    assert scored(f" {rs}{d.references[0]}") == 0.0  # leading space: 0, as the card's grade gives
    assert scored(f"\n{rs}{d.references[0]}") == 0.0
    assert 0.9 < scored(f"{rs}{d.references[0]}\n\n") < 1.0  # trailing text counts too
