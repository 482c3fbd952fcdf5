"""The 13 RULER generators against what the paper and its reference implementation promise.

Every task is generated with the real SmolLM2 tokenizer and chat template at several lengths; the
instances of each (task, length) are generated once per module and checked from many angles:
determinism and sharding, exact length accounting, prompt text vs token ids, where the answers are,
the scorer, and the paper's parameters. QA reads small synthetic SQuAD / HotpotQA files.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from longeval.errors import DataFileError, LengthError
from longeval.planning.plan import ShardSpec
from longeval.records import Instance
from longeval.scoring import string_match_all, string_match_part
from longeval.stages.generate import generate_shard
from longeval.tasks import TASKS, get_task
from longeval.tasks.base import DataPaths, GenContext, TaskSpec, instance_rng, make_instance, output_budget
from longeval.tasks.ruler import RULER_TASKS
from longeval.tasks.ruler.niah import DEPTHS
from longeval.tasks.ruler.templates import fill
from longeval.text import words
from longeval.text.corpus import NOISE
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder, load_encoder
from tests.qa_fixtures import hotpotqa_file, squad_file  # noqa: F401

SEED = 1234
N = 4  # instances per (task, length)
LENGTHS = (1024, 2048, 4096, 8192)
LONG_TASKS = ("ruler/niah_single_2", "ruler/niah_multikey_3", "ruler/cwe")  # also generated at 32768
QA_TASKS = ("ruler/qa_1", "ruler/qa_2")
QA_LENGTHS = (2048, 4096)
NIAH_TASKS = tuple(s.key for s in RULER_TASKS if s.name.startswith("niah"))

# RULER's tokens_to_generate per task family.
OUTPUT_BUDGET = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}

NEEDLE = re.compile(r"One of the special magic (numbers|uuids|words) for (.+?) is: (\S+)\.")
"""A needle; keys may hold a space (RULER's word lists have "dust storm", "ad hoc")."""
CWE_ENTRY = re.compile(r"(\d+)\. (.+?)(?= \d+\. |$)")
"""A numbered CWE entry; words may hold a space ("creme brulee")."""
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SEVEN_DIGITS = re.compile(r"[1-9][0-9]{6}")


def _lengths(key: str) -> tuple[int, ...]:
    if key in QA_TASKS:
        return QA_LENGTHS
    return LENGTHS + ((32768,) if key in LONG_TASKS else ())


CASES = [pytest.param(s.key, n, id=f"{s.name}-{n}") for s in RULER_TASKS for n in _lengths(s.key)]


def _family(key: str) -> str:
    name = key.split("/")[1]
    return "niah" if name.startswith("niah") else "qa" if name.startswith("qa") else name


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.fixture(scope="module")
def data(squad_file: Path, hotpotqa_file: Path) -> DataPaths:  # noqa: F811
    return DataPaths(squad_path=str(squad_file), hotpotqa_path=str(hotpotqa_file))


@pytest.fixture(scope="module")
def ctx(encoder: Encoder, data: DataPaths) -> GenContext:
    return GenContext(encoder=encoder, fmt=PromptFormat(), data=data)


@pytest.fixture(scope="module")
def shard(ctx: GenContext) -> Callable[[str, int], pa.Table]:
    """Instances 0..N-1 of a (task, length) as one shard table, generated once per module."""
    cache: dict[tuple[str, int], pa.Table] = {}

    def get(key: str, length: int) -> pa.Table:
        if (key, length) not in cache:
            cache[(key, length)] = generate_shard(ctx, ShardSpec(key, length, SEED, 0, 0, N))
        return cache[(key, length)]

    return get


@pytest.fixture(scope="module")
def instances(shard: Callable[[str, int], pa.Table]) -> Callable[[str, int], list[Instance]]:
    def get(key: str, length: int) -> list[Instance]:
        return [Instance.from_row(row) for row in shard(key, length).to_pylist()]

    return get


def _generate(ctx: GenContext, key: str, length: int, index: int, seed: int = SEED) -> Instance:
    spec = get_task(key)
    draft = spec.generate(
        ctx, spec.params, target_length=length, max_new_tokens=output_budget(spec, ctx.fmt, length),
        rng=instance_rng(seed, spec.key, length, index), index=index,
    )
    return make_instance(spec, draft, ctx, target_length=length, seed=seed, shard_index=0, index=index)


# -- splitting a prompt into its parts ----------------------------------------------------------------

_CONTEXT_BOUNDS = {
    # (text just before the context, text just after it); the last occurrence of each (ICL examples come first)
    "vt": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n",
           "\nQuestion: Find all variables that are assigned the value"),
    "cwe": ("Memorize the ones that appear most often.\n", "\nQuestion: What are the 10 most common words"),
    "fwe": ("Find the three most frequently appeared coded words. ", "\nQuestion: Do not provide any explanation."),
    "qa": ("The following are given documents.\n\n", "\n\nAnswer the question based on the given documents."),
}


def _context(inst: Instance) -> str:
    family = _family(f"{inst.family}/{inst.task}")
    if family == "niah":
        kind = re.search(r"I will quiz you about the (\w+) afterwards\.\n", inst.prompt)
        assert kind is not None
        singular = kind.group(1) in ("number", "uuid")
        after = "\nWhat is the special magic" if singular else "\nWhat are all the special magic"
        before = kind.group(0)
    else:
        before, after = _CONTEXT_BOUNDS[family]
    start = inst.prompt.rindex(before) + len(before)
    end = inst.prompt.rindex(after)
    assert start < end
    return inst.prompt[start:end]


def _meta(inst: Instance) -> dict:
    return json.loads(inst.meta)


# -- determinism -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "length"), CASES)
def test_same_seed_and_index_give_the_same_instance(
    key: str, length: int, ctx: GenContext, encoder: Encoder, data: DataPaths,
    instances: Callable[[str, int], list[Instance]],
) -> None:
    fresh = GenContext(encoder=encoder, fmt=PromptFormat(), data=data)  # empty per-process cache
    first, again = _generate(ctx, key, length, 2), _generate(fresh, key, length, 2)
    from_shard = instances(key, length)[2]
    for other in (again, from_shard):
        assert other.prompt == first.prompt
        assert list(other.prompt_token_ids) == list(first.prompt_token_ids)
        assert other.references == first.references
        assert other.meta == first.meta
        assert other.instance_id == first.instance_id
        assert other.depth == first.depth


@pytest.mark.parametrize(("key", "length"), CASES)
def test_sharding_does_not_change_rows(
    key: str, length: int, encoder: Encoder, data: DataPaths, shard: Callable[[str, int], pa.Table]
) -> None:
    whole = shard(key, length)
    fresh = GenContext(encoder=encoder, fmt=PromptFormat(), data=data)
    # The second shard first, in a fresh context: neither order nor cache state may matter.
    second = generate_shard(fresh, ShardSpec(key, length, SEED, 1, N // 2, N))
    first = generate_shard(fresh, ShardSpec(key, length, SEED, 0, 0, N // 2))
    split = pa.concat_tables([first, second])
    assert split.num_rows == whole.num_rows == N
    assert split["shard_index"].to_pylist() == [0] * (N // 2) + [1] * (N - N // 2)
    assert split.drop_columns(["shard_index"]).equals(whole.drop_columns(["shard_index"]))


@pytest.mark.parametrize(("key", "length"), CASES)
def test_different_index_or_seed_gives_a_different_instance(
    key: str, length: int, ctx: GenContext, instances: Callable[[str, int], list[Instance]]
) -> None:
    insts = instances(key, length)
    assert len({i.prompt for i in insts}) == N
    assert len({i.instance_id for i in insts}) == N
    assert len({tuple(i.references) for i in insts}) == N
    other_seed = _generate(ctx, key, length, 0, seed=SEED + 1)
    assert other_seed.prompt != insts[0].prompt
    assert other_seed.instance_id != insts[0].instance_id


# -- length accounting and prompt text ---------------------------------------------------------------


LINE_TASKS = ("ruler/niah_single_1", "ruler/vt")
"""Noise haystacks of whole paragraphs (RULER's): they fill to within one noise line, not always to 99 %."""


def _floor(key: str, length: int, encoder: Encoder) -> float:
    """The least input + output a (task, length) must reach: 99 %, or one noise line short for line haystacks."""
    if key in LINE_TASKS or get_task(key).key in LINE_TASKS:
        return min(0.99 * length, length - encoder.count(NOISE + "\n"))
    return 0.99 * length


@pytest.mark.parametrize(("key", "length"), CASES)
def test_exact_length_and_fill(
    key: str, length: int, encoder: Encoder, instances: Callable[[str, int], list[Instance]]
) -> None:
    for inst in instances(key, length):
        assert inst.target_length == length
        assert inst.input_tokens == len(inst.prompt_token_ids)
        assert inst.input_tokens + inst.max_new_tokens <= length
        assert inst.input_tokens + inst.max_new_tokens >= _floor(key, length, encoder), (inst.index, inst.input_tokens)
        if length >= 4096:
            assert inst.input_tokens + inst.max_new_tokens >= 0.99 * length


@pytest.mark.parametrize(("key", "length"), CASES)
def test_token_ids_decode_to_the_prompt(
    key: str, length: int, encoder: Encoder, instances: Callable[[str, int], list[Instance]]
) -> None:
    for inst in instances(key, length):
        assert encoder.tokenizer.decode(inst.prompt_token_ids) == inst.prompt


@pytest.mark.parametrize(("key", "length"), CASES)
def test_retokenized_prompt_length_is_within_half_a_percent(
    key: str, length: int, encoder: Encoder, instances: Callable[[str, int], list[Instance]]
) -> None:
    for inst in instances(key, length):
        retokenized = len(encoder.tokenizer.encode(inst.prompt, add_special_tokens=False))
        assert abs(retokenized - inst.input_tokens) <= 0.005 * inst.input_tokens, (retokenized, inst.input_tokens)


@pytest.mark.parametrize(("key", "length"), CASES)
def test_token_ids_are_the_tokenization_of_the_prompt(
    key: str, length: int, encoder: Encoder, instances: Callable[[str, int], list[Instance]]
) -> None:
    """text.pieces promises 'the concatenation is the tokenization the model would see'."""
    tokenizer = encoder.tokenizer
    for inst in instances(key, length):
        ours, canonical = list(inst.prompt_token_ids), tokenizer.encode(inst.prompt, add_special_tokens=False)
        at = next((i for i, (a, b) in enumerate(zip(ours, canonical, strict=False)) if a != b), None)
        where = None if at is None else (tokenizer.convert_ids_to_tokens(ours[at - 2 : at + 3]),
                                         tokenizer.convert_ids_to_tokens(canonical[at - 2 : at + 3]))
        assert ours == canonical, (len(ours), len(canonical), at, where)


# -- answers in the context, and the scorer ----------------------------------------------------------


def _is_adjective_noun(key: str) -> bool:
    adjectives, nouns = set(words.adjectives()), set(words.nouns())
    return any(key[:i] in adjectives and key[i + 1 :] in nouns for i, ch in enumerate(key) if ch == "-")


def _check_value(kind: str, value: str) -> None:
    if kind == "numbers":
        assert SEVEN_DIGITS.fullmatch(value), value
    else:
        assert kind == "uuids"
        assert UUID.fullmatch(value), value
        assert len(value.replace("-", "")) == 32


def _check_niah(inst: Instance, spec: TaskSpec) -> None:
    params = spec.params
    context = _context(inst)
    meta = _meta(inst)
    needles = NEEDLE.findall(context)
    kinds = {kind for kind, _, _ in needles}
    assert kinds == {params.type_value}
    for _, key, value in needles:
        _check_value(params.type_value, value)
        if params.type_key == "words":
            assert _is_adjective_noun(key), key
        else:
            assert UUID.fullmatch(key), key
    by_key: dict[str, list[str]] = {}
    for _, key, value in needles:
        by_key.setdefault(key, []).append(value)
    query_keys = meta["keys"]
    assert len(query_keys) == params.num_needle_q
    # Every queried key's needles carry exactly its references (grouped by key, in query order).
    per_key = params.num_needle_v
    assert len(inst.references) == params.num_needle_q * per_key
    for i, key in enumerate(query_keys):
        assert sorted(by_key[key]) == sorted(inst.references[i * per_key : (i + 1) * per_key])
    if params.haystack == "needle":
        # The haystack is made of distractor needles only, each key once (besides the queried one).
        assert all(len(by_key[k]) == 1 for k in by_key)
        assert len(needles) > 8
        stripped = NEEDLE.sub("", context)
        assert stripped.strip() == "", stripped[:200]
    else:
        assert len(by_key) == params.num_needle_k
        assert len(needles) == params.num_needle_k * params.num_needle_v
        if params.haystack == "noise":
            assert set(NEEDLE.sub("", context).split()) <= set(NOISE.split())
    # The question and the needle sentence wording are RULER's: singular for one query with one value.
    query = query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
    if params.num_needle_q * params.num_needle_v == 1:
        question = f"What is the special magic {params.type_value[:-1]} for {query} mentioned in the provided text?"
        assert f"A special magic {params.type_value[:-1]} is hidden" in inst.prompt
        assert "Some special" not in inst.prompt
    else:
        question = f"What are all the special magic {params.type_value} for {query} mentioned in the provided text?"
        assert f"Some special magic {params.type_value} are hidden" in inst.prompt
    assert question in inst.prompt
    if params.haystack != "essay":  # one needle or noise paragraph per line, whole lines only
        lines = context.split("\n")
        assert all(NEEDLE.fullmatch(ln) or ln == NOISE for ln in lines), [ln for ln in lines if ln != NOISE][:3]
    else:
        assert "\n" + NEEDLE.pattern[:10] not in context and "One of the special magic" in context
    for value in inst.references:
        assert value in context


def _check_vt(inst: Instance) -> None:
    context = _context(inst)
    chain = inst.references
    assert len(chain) == 5 and len(set(chain)) == 5
    assert all(re.fullmatch(r"[A-Z]{5}", v) for v in chain)
    value = _meta(inst)["value"]
    assert re.fullmatch(r"[1-9][0-9]{4}", value)
    positions = [context.index(f"VAR {chain[0]} = {value}\n")]
    positions += [context.index(f"VAR {chain[j + 1]} = VAR {chain[j]} ") for j in range(4)]
    assert positions == sorted(positions)  # the chain is stated in order
    assert len(re.findall(r"VAR [A-Z]+ = ", context)) == 5  # one chain of 4 hops, nothing else
    assert f"assigned the value {value} in the text above" in inst.prompt
    lines = [ln for ln in context.split("\n") if ln and not ln.startswith("VAR ")]
    assert len(lines) > 5
    assert all(ln == NOISE for ln in lines)  # whole noise lines between the statements, and at the end
    assert context.endswith(NOISE) and "\n\n" not in context


def _check_cwe(inst: Instance) -> None:
    context = _context(inst)
    entries = CWE_ENTRY.findall(context)
    assert [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))
    counts = Counter(w for _, w in entries)
    meta = _meta(inst)
    common = inst.references
    assert len(common) == 10 and len(set(common)) == 10
    assert all(counts[w] == meta["freq_cw"] for w in common)
    others = [c for w, c in counts.items() if w not in common]
    assert others and max(others) < min(counts[w] for w in common)
    assert set(others) == {meta["freq_ucw"]}
    assert len(others) == meta["num_ucw"]
    assert len(entries) == 10 * meta["freq_cw"] + meta["num_ucw"] * meta["freq_ucw"]


def _check_fwe(inst: Instance) -> None:
    coded = _context(inst).split()
    counts = Counter(coded).most_common()
    assert counts[0][0] == "..."  # RULER's vocab[0] = '...'; its template says '....'

    assert counts[0][1] > counts[1][1]
    assert set(inst.references) == {w for w, _ in counts[1:4]}
    assert counts[3][1] > counts[4][1]  # the top three are unambiguous
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in inst.references)
    assert [c for _, c in counts[:5]] == _meta(inst)["top_counts"]


def _check_qa(inst: Instance) -> None:
    context = _context(inst)
    headers = [int(n) for n in re.findall(r"(?:^|\n\n)Document (\d+):\n", context)]
    assert headers == list(range(1, len(headers) + 1))
    assert len(headers) >= 3
    for ref in inst.references:
        assert ref in context
    assert f"Question: {_meta(inst)['query']}" in inst.prompt


@pytest.mark.parametrize(("key", "length"), CASES)
def test_references_occur_in_the_context(
    key: str, length: int, instances: Callable[[str, int], list[Instance]]
) -> None:
    spec = get_task(key)
    for inst in instances(key, length):
        assert inst.references and all(inst.references)
        family = _family(key)
        if family == "niah":
            _check_niah(inst, spec)
        else:
            {"vt": _check_vt, "cwe": _check_cwe, "fwe": _check_fwe, "qa": _check_qa}[family](inst)


@pytest.mark.parametrize(("key", "length"), CASES)
def test_scorer_on_references_and_on_empty_output(
    key: str, length: int, instances: Callable[[str, int], list[Instance]]
) -> None:
    for inst in instances(key, length):
        metric = {"string_match_all": string_match_all, "string_match_part": string_match_part}[inst.metric]
        assert metric(" ".join(inst.references), inst.references) == 1.0
        assert metric("", inst.references) == 0.0


# -- parameters as the paper states them -------------------------------------------------------------


def test_registry_holds_the_13_tasks_of_the_paper() -> None:
    names = [s.name for s in RULER_TASKS]
    assert names == [
        "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
        "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2",
    ]
    assert all(TASKS[s.key] is s and get_task(s.name) is s for s in RULER_TASKS)


@pytest.mark.parametrize("spec", RULER_TASKS, ids=lambda s: s.name)
def test_output_budget_and_metric(spec: TaskSpec) -> None:
    family = _family(spec.key)
    assert spec.max_new_tokens == OUTPUT_BUDGET[family]
    assert spec.metric == ("string_match_part" if family == "qa" else "string_match_all")
    assert output_budget(spec, PromptFormat(), 8192) == OUTPUT_BUDGET[family]
    assert output_budget(spec, PromptFormat(answer_prefix=False), 8192) == OUTPUT_BUDGET[family]
    assert output_budget(spec, PromptFormat(reasoning=True), 8192) > OUTPUT_BUDGET[family]


def test_niah_parameters() -> None:
    p = {s.name: s.params for s in RULER_TASKS if s.name.startswith("niah")}
    expected = {  # haystack, key, value, k, v, q
        "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
        "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
        "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
        "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
        "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
        "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
        "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
        "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
    }
    for name, (haystack, tk, tv, k, v, q) in expected.items():
        got = p[name]
        assert (got.haystack, got.type_key, got.type_value) == (haystack, tk, tv), name
        assert (got.num_needle_k, got.num_needle_v, got.num_needle_q) == (k, v, q), name


def test_other_parameters() -> None:
    vt, cwe, fwe = (get_task(n).params for n in ("vt", "cwe", "fwe"))
    assert (vt.num_chains, vt.num_hops, vt.name_length, vt.icl_example) == (1, 4, 5, True)
    assert (cwe.freq_cw, cwe.freq_ucw, cwe.num_cw, cwe.icl_example, cwe.short_below) == (30, 3, 10, True, 4096)
    assert fwe.alpha == 2.0 and fwe.noise_word == "..."
    assert get_task("qa_1").params.dataset == "squad" and get_task("qa_1").needs == ("squad_path",)
    assert get_task("qa_2").params.dataset == "hotpotqa" and get_task("qa_2").needs == ("hotpotqa_path",)


@pytest.mark.parametrize("length", [1024, 2048, 4096, 8192])
def test_cwe_frequencies_by_length(length: int, instances: Callable[[str, int], list[Instance]]) -> None:
    inst = instances("ruler/cwe", length)[0]
    meta = _meta(inst)
    expected = (6, 1) if length < 4096 else (30, 3)
    assert (meta["freq_cw"], meta["freq_ucw"]) == expected
    assert inst.complexity == f"cw10-f{expected[0]}-u{expected[1]}"


def test_depths_are_40_evenly_spaced() -> None:
    assert len(DEPTHS) == 40
    assert tuple(round(100 * i / 39) for i in range(40)) == DEPTHS
    assert DEPTHS[0] == 0 and DEPTHS[-1] == 100


@pytest.mark.parametrize("spec", RULER_TASKS, ids=lambda s: s.name)
def test_answer_prefix_and_reasoning_mode(spec: TaskSpec, encoder: Encoder, data: DataPaths) -> None:
    length = 4096
    with_prefix = _generate(GenContext(encoder, PromptFormat(), data), spec.key, length, 0)
    no_prefix = _generate(GenContext(encoder, PromptFormat(answer_prefix=False), data), spec.key, length, 0)
    reasoning = _generate(GenContext(encoder, PromptFormat(reasoning=True), data), spec.key, length, 0)
    generation_prompt = "<|im_start|>assistant\n"
    assert with_prefix.answer_prefix.strip()
    assert with_prefix.prompt.endswith(generation_prompt + with_prefix.answer_prefix)
    family = _family(spec.key)
    template = {"niah": "niah", "vt": "variable_tracking", "cwe": "common_words_extraction",
                "fwe": "freq_words_extraction", "qa": "qa"}[family]
    stem = fill(template, type_needle_v="X", query="X", num_v=5)[1].split("X")[0]
    assert with_prefix.answer_prefix.startswith(stem)
    for inst in (no_prefix, reasoning):
        assert inst.answer_prefix == ""
        assert inst.prompt.endswith(generation_prompt)
        assert stem.strip() not in inst.prompt[-len(generation_prompt) - len(stem) - 5 :]
        assert inst.input_tokens + inst.max_new_tokens <= length
        assert inst.input_tokens + inst.max_new_tokens >= _floor(spec.key, length, encoder)
    assert no_prefix.max_new_tokens == with_prefix.max_new_tokens == spec.max_new_tokens
    assert reasoning.max_new_tokens > with_prefix.max_new_tokens
    assert _meta(reasoning)["reasoning"] is True and _meta(with_prefix)["reasoning"] is False
    assert len({with_prefix.instance_id, no_prefix.instance_id, reasoning.instance_id}) == 3


@pytest.mark.parametrize("spec", RULER_TASKS, ids=lambda s: s.name)
def test_plain_prompt_without_chat_template(spec: TaskSpec, encoder: Encoder, data: DataPaths) -> None:
    inst = _generate(GenContext(encoder, PromptFormat(chat_template=False), data), spec.key, 4096, 1)
    assert "<|im_start|>" not in inst.prompt
    assert inst.prompt.endswith(inst.answer_prefix) and inst.answer_prefix
    assert _floor(spec.key, 4096, encoder) <= inst.input_tokens + inst.max_new_tokens <= 4096
    assert encoder.tokenizer.decode(inst.prompt_token_ids) == inst.prompt


@pytest.mark.parametrize("haystack", ["essay", "needle"])
def test_needle_ids_of_keys_with_a_space_are_their_tokenization(haystack: str, ctx: GenContext) -> None:
    """Keys like RULER's "instinctive-dust storm" or "ad hoc-creme brulee" assemble from their parts as well."""
    from longeval.tasks.ruler.niah import NiahParams, needle_ids, needle_text

    params = NiahParams(haystack=haystack)
    keys = ["quiet-lamp", "bold-river", "tiny-stone", "instinctive-dust storm", "ad hoc-creme brulee",
            "blue-eyed-contact lens"]
    values = [str(1234567 + i) for i in range(len(keys))]
    encode = ctx.encoder.encode_followed if haystack == "needle" else ctx.encoder.encode
    expected = [encode(needle_text(params, k, v)).tolist() for k, v in zip(keys, values, strict=True)]
    assert [ids.tolist() for ids in needle_ids(ctx, params, keys, values)] == expected
    assert all(_is_adjective_noun(k) for k in keys[3:])


# -- NIAH depth --------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", NIAH_TASKS)
def test_niah_depth_is_stratified_and_the_needles_sit_there(key: str, ctx: GenContext) -> None:
    spec = get_task(key)
    for index in (0, 3, 10, 19, 26, 33, 39, 45):
        inst = _generate(ctx, key, 8192, index)
        assert inst.depth == DEPTHS[index % 40]
        depths = _meta(inst)["depths"]
        assert inst.depth in depths
        context = _context(inst)
        starts = [m.start() / len(context) * 100 for m in NEEDLE.finditer(context)]
        if spec.params.haystack == "needle":
            query_key = _meta(inst)["keys"][0]
            starts = [m.start() / len(context) * 100 for m in NEEDLE.finditer(context) if m.group(2) == query_key]
        assert len(starts) == len(depths)
        for where, depth in zip(sorted(starts), sorted(depths), strict=True):
            assert abs(where - depth) <= 10, (index, where, depth)


@pytest.mark.parametrize(
    ("key", "length"),
    [pytest.param("ruler/niah_multikey_2", n, id=f"niah_multikey_2-{n}") for n in (1024, 2048)]
    + [pytest.param("ruler/niah_multikey_3", n, id=f"niah_multikey_3-{n}") for n in (1024, 2048)],
)
def test_needle_haystack_fill_at_every_depth(key: str, length: int, ctx: GenContext) -> None:
    """Haystacks of whole distractor needles must still reach 99 % of the length, at all 40 depths."""
    fills = {}
    for index in range(40):
        inst = _generate(ctx, key, length, index)
        assert inst.input_tokens + inst.max_new_tokens <= length
        fills[index] = (inst.input_tokens + inst.max_new_tokens) / length
    assert min(fills.values()) >= 0.99, {i: round(f, 4) for i, f in fills.items() if f < 0.99}


def test_niah_uses_the_essay_folder(encoder: Encoder, tmp_path: Path) -> None:
    folder = tmp_path / "essays"
    folder.mkdir()
    (folder / "one.txt").write_text("Zebras graze quietly near the riverbank. " * 30, encoding="utf-8")
    ctx = GenContext(encoder, PromptFormat(), DataPaths(essay_dir=str(folder)))
    inst = _generate(ctx, "niah_single_2", 2048, 0)
    context = NEEDLE.sub("", _context(inst))
    assert set(re.findall(r"[A-Za-z]+", context)) <= {"Zebras", "graze", "quietly", "near", "the", "riverbank"}
    assert _meta(inst)["corpus"] == f"{folder} (user folder)"  # every instance says which haystack it used
    assert 0.99 * 2048 <= inst.input_tokens + inst.max_new_tokens <= 2048


# -- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", RULER_TASKS, ids=lambda s: s.name)
def test_too_short_a_length_raises_length_error(spec: TaskSpec, ctx: GenContext) -> None:
    length = 140 if spec.name == "fwe" else 200  # fwe's template and budget do fit in 200 tokens
    with pytest.raises(LengthError, match=r"suite\.lengths"):
        _generate(ctx, spec.key, length, 0)


@pytest.mark.parametrize(
    "spec",
    [pytest.param(s, id=s.name) for s in RULER_TASKS],
)
def test_small_lengths_fit_or_say_which_setting_to_change(spec: TaskSpec, ctx: GenContext) -> None:
    """Between 'cannot fit' and 'fits', every length either fits the budget or names suite.lengths."""
    problems = []
    for length in range(100, 500, 20):
        try:
            inst = _generate(ctx, spec.key, length, 1)
        except LengthError as exc:
            if "suite.lengths" not in str(exc):
                problems.append((length, str(exc)))
        else:
            assert inst.input_tokens + inst.max_new_tokens <= length
    assert not problems


@pytest.mark.parametrize(("name", "config_key"), [("qa_1", "suite.data.squad_path"),
                                                  ("qa_2", "suite.data.hotpotqa_path")])
def test_qa_missing_file(name: str, config_key: str, encoder: Encoder, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "dev.json"
    for paths in (DataPaths(squad_path=str(missing), hotpotqa_path=str(missing)), DataPaths()):
        ctx = GenContext(encoder, PromptFormat(), paths)
        with pytest.raises(DataFileError) as info:
            _generate(ctx, name, 4096, 0)
        message = str(info.value)
        assert config_key in message
        if paths.squad_path:
            assert str(missing) in message


@pytest.mark.parametrize("name", ["qa_1", "qa_2"])
@pytest.mark.parametrize(
    "content",
    ['{"version": "v2.0", "data": [', "not json at all", '{"data": [{"title": "x"}]}', "[1, 2, 3]", "{}",
     '{"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [{"question": "q", "answers": [], '
     '"is_impossible": true}]}]}]}', "[]", b"\xff\xfe\x00garbage"],
    ids=["truncated", "not-json", "no-paragraphs", "wrong-items", "empty-object", "only-impossible",
         "empty-list", "not-utf8"],
)
def test_qa_malformed_file(name: str, content: str | bytes, encoder: Encoder, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content, encoding="utf-8")
    ctx = GenContext(encoder, PromptFormat(), DataPaths(squad_path=str(bad), hotpotqa_path=str(bad)))
    with pytest.raises(DataFileError) as info:
        _generate(ctx, name, 4096, 0)
    assert str(bad) in str(info.value)
    assert ("suite.data.squad_path" if name == "qa_1" else "suite.data.hotpotqa_path") in str(info.value)


def test_qa_fixture_files_are_in_the_upstream_formats(squad_file: Path, hotpotqa_file: Path) -> None:  # noqa: F811
    squad = json.loads(squad_file.read_text(encoding="utf-8"))
    assert squad["version"] == "v2.0"
    impossible = 0
    paragraphs = 0
    for article in squad["data"]:
        assert set(article) == {"title", "paragraphs"}
        for para in article["paragraphs"]:
            paragraphs += 1
            assert 80 <= len(para["context"].split()) <= 150
            for qa in para["qas"]:
                if qa["is_impossible"]:
                    impossible += 1
                    assert qa["answers"] == []
                for ans in qa["answers"]:
                    assert para["context"][ans["answer_start"] :].startswith(ans["text"])
    assert impossible > 0 and paragraphs >= 100
    hotpot = json.loads(hotpotqa_file.read_text(encoding="utf-8"))
    for item in hotpot:
        assert set(item) == {"_id", "question", "answer", "type", "level", "supporting_facts", "context"}
        assert len(item["context"]) == 10
        paras = dict((t, s) for t, s in item["context"])
        for title, idx in item["supporting_facts"]:
            assert 0 <= idx < len(paras[title])
        assert any(item["answer"] in "".join(paras[t]) for t, _ in item["supporting_facts"])


def test_instance_fields_are_consistent(instances: Callable[[str, int], list[Instance]], encoder: Encoder) -> None:
    inst = instances("ruler/niah_single_1", 1024)[0]
    assert inst.family == "ruler" and inst.task == "niah_single_1"
    assert inst.seed == SEED and inst.index == 0 and inst.shard_index == 0
    assert inst.tokenizer_id == encoder.fingerprint
    meta = _meta(inst)
    assert meta["prompt_format"] == {"chat_template": True, "answer_prefix": True, "system_prompt": None,
                                     "reasoning": False}
    assert meta["params"]["haystack"] == "noise"


@pytest.mark.parametrize(("name", "field", "value"), [("qa_1", "answer", None), ("qa_1", "answer", 42),
                                                      ("qa_2", "answer", None)])
def test_qa_answers_of_the_wrong_type(
    name: str, field: str, value: object, encoder: Encoder, squad_file: Path, hotpotqa_file: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.json"
    if name == "qa_1":
        raw = json.loads(squad_file.read_text(encoding="utf-8"))
        for article in raw["data"]:
            for para in article["paragraphs"]:
                for qa in para["qas"]:
                    for answer in qa["answers"]:
                        answer["text"] = value
    else:
        raw = json.loads(hotpotqa_file.read_text(encoding="utf-8"))
        for item in raw:
            item[field] = value
    bad.write_text(json.dumps(raw), encoding="utf-8")
    ctx = GenContext(encoder, PromptFormat(), DataPaths(squad_path=str(bad), hotpotqa_path=str(bad)))
    with pytest.raises(DataFileError):
        generate_shard(ctx, ShardSpec(get_task(name).key, 4096, SEED, 0, 0, 1))


def test_qa_data_too_small_for_the_length(encoder: Encoder, tmp_path: Path) -> None:
    from tests.qa_fixtures import write_squad

    small = write_squad(tmp_path / "small.json", n_articles=2, paragraphs=3)
    ctx = GenContext(encoder, PromptFormat(), DataPaths(squad_path=str(small)))
    with pytest.raises(LengthError, match="larger data file"):
        _generate(ctx, "qa_1", 8192, 0)
    inst = _generate(ctx, "qa_1", 1024, 0)  # six short paragraphs do fill 1024 tokens
    assert 0.99 * 1024 <= inst.input_tokens + inst.max_new_tokens <= 1024
