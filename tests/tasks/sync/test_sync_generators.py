"""The six SYNC generators with the real SmolLM2 tokenizer and chat template, run as the pipeline runs them.

Checked: exact lengths and fill, the three tasks of a domain sharing head + context token for token, token
ids that are the tokenization of the prompt text, determinism, contexts that state exactly the graph or
dictionaries in `meta`, answerable queries, and the CoT / no-CoT / plain / reasoning prompt formats.

Fill, (input_tokens + max_new_tokens) / target_length, measured with SmolLM2 at seed 20250417, instances 0-5
(lowest task .. the task with the longest question, i.e. shortest_path or a translation question):
    graph:        2K 98.4 % .. 99.95 %   4K 99.1 % .. 99.95 %   8K 99.6 % .. 99.99 %   32K 99.9 % .. 99.99 %
    translation:  2K does not fit (the dictionaries alone exceed the room left by a 1024-token CoT budget)
                  4K 99.3 % .. 99.8 %    8K 99.7 % .. 99.9 %    32K 99.9 % .. 99.97 %
`test_exact_lengths_and_fill` holds every cell to >= 99 % for the longest question and >= 98 % (2K) or
99 % (4K and up) for the others.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

import networkx as nx
import numpy as np
import pytest

from longeval.errors import LengthError
from longeval.records import Instance
from longeval.tasks.base import Draft, GenContext, TaskSpec
from longeval.tasks.sync import (
    CONTEXT_GROUPS,
    COT_MAX_NEW_TOKENS,
    DIRECT_MAX_NEW_TOKENS,
    SYNC_SCORERS,
    SYNC_TASKS,
    GraphParams,
    TranslationParams,
    max_new_tokens,
)
from longeval.tasks.sync.prompts import TASK_PROMPTS
from longeval.text.render import PromptFormat
from longeval.text.tokenizer import Encoder
from tests.tasks.sync.sync_helpers import SEED, run

GRAPH = "sync/graph"
TRANSLATION = "sync/translation"
LENGTHS = {GRAPH: (2048, 4096, 8192, 32768), TRANSLATION: (4096, 8192, 32768)}
INDICES = (0, 1, 2)  # one instance of each node count / number of languages
SPECS = {spec.name: spec for spec in SYNC_TASKS}
GROUP_TASKS = {group: [s for s in SYNC_TASKS if s.context_group == group] for group in (GRAPH, TRANSLATION)}
CELLS = [(group, length, index) for group in LENGTHS for length in LENGTHS[group] for index in INDICES]

EDGE = re.compile(r"There is a directed edge from Node (\d+) to Node (\d+)\.")
SELF = re.compile(r"There is no directed edge from Node (\d+) to Node (\d+)\.")
DICTIONARY = re.compile(r"Dictionary from LL(\d) to LL(\d): ([^\n]*)\.")
VOCABULARY = re.compile(r"The vocabulary of LL(\d): ([^\n]*)")

Made = dict[tuple[str, int, int], tuple[Draft, Instance]]


@pytest.fixture(scope="module")
def made(ctx: GenContext) -> Made:
    """Every (task, length, index) of the module, generated once."""
    out: Made = {}
    for group, length, index in CELLS:
        for spec in GROUP_TASKS[group]:
            out[(spec.name, length, index)] = run(ctx, spec, length, index)
    return out


def _cell(made: Made, group: str, length: int, index: int) -> list[Instance]:
    return [made[(spec.name, length, index)][1] for spec in GROUP_TASKS[group]]


def _tail_tokens(encoder: Encoder, inst: Instance) -> int:
    """Tokens after the context: the task question starts at the last blank line of the prompt."""
    return len(encoder.encode(inst.prompt[inst.prompt.rindex("\n\n") :]))


def _context(inst: Instance) -> str:
    head = inst.prompt.index("memorize them.") + len("memorize them.") if "graph" in inst.prompt[:400] \
        else inst.prompt.index("duplicated.\n\n") + len("duplicated.\n\n")
    return inst.prompt[head : inst.prompt.rindex("\n\n")]


def _meta(inst: Instance) -> dict:
    return json.loads(inst.meta)


def _fill(inst: Instance) -> float:
    return (inst.input_tokens + inst.max_new_tokens) / inst.target_length


# -- lengths, prefix sharing, tokenization ----------------------------------------------------------------


@pytest.mark.parametrize(("group", "length", "index"), CELLS)
def test_exact_lengths_and_fill(group: str, length: int, index: int, made: Made) -> None:
    cell = _cell(made, group, length, index)
    for inst in cell:
        assert inst.input_tokens == len(inst.prompt_token_ids)
        assert inst.input_tokens + inst.max_new_tokens <= length
        assert inst.max_new_tokens == COT_MAX_NEW_TOKENS
    assert max(map(_fill, cell)) >= 0.99  # the task with the longest tail: its context fills the budget
    assert min(map(_fill, cell)) >= (0.98 if length <= 2048 else 0.99)


@pytest.mark.parametrize(("group", "length", "index"), CELLS)
def test_the_three_tasks_share_head_and_context(group: str, length: int, index: int, made: Made,
                                                encoder: Encoder) -> None:
    cell = _cell(made, group, length, index)
    shared = [inst.prompt_token_ids[: len(inst.prompt_token_ids) - _tail_tokens(encoder, inst)] for inst in cell]
    assert all(np.array_equal(shared[0], ids) for ids in shared[1:])
    assert len(shared[0]) >= length - COT_MAX_NEW_TOKENS - 120  # all but the task's question and template end
    texts = {inst.prompt[: inst.prompt.rindex("\n\n")] for inst in cell}
    assert len(texts) == 1
    assert len({inst.context_id for inst in cell}) == 1
    assert len({inst.prompt for inst in cell}) == 3  # the questions differ


@pytest.mark.parametrize(("group", "length", "index"), CELLS)
def test_token_ids_are_the_tokenization_of_the_prompt(group: str, length: int, index: int, made: Made,
                                                      encoder: Encoder) -> None:
    for inst in _cell(made, group, length, index):
        ids = list(inst.prompt_token_ids)
        assert ids == encoder.tokenizer.encode(inst.prompt, add_special_tokens=False)
        assert encoder.tokenizer.decode(ids) == inst.prompt


def test_same_seed_same_ids_other_seed_other_layout(made: Made, encoder: Encoder) -> None:
    fresh = GenContext(encoder=encoder)  # nothing cached
    for name in ("longest_path", "letter_coverage"):
        first = made[(name, 8192, 1)][1]
        again = run(fresh, SPECS[name], 8192, 1)[1]
        assert np.array_equal(first.prompt_token_ids, again.prompt_token_ids) and first.meta == again.meta
        other = run(fresh, SPECS[name], 8192, 1, seed=SEED + 1)[1]
        assert not np.array_equal(first.prompt_token_ids, other.prompt_token_ids)
        assert _meta(other)["task"] == name


def test_the_same_graphs_and_languages_at_every_length(made: Made) -> None:
    """As in the paper, the data set is fixed and only the haystack grows with the length."""
    for index in INDICES:
        edges = {json.dumps(_meta(made[("longest_path", n, index)][1])["edges"]) for n in LENGTHS[GRAPH]}
        chains = {json.dumps(_meta(made[("letter_coverage", n, index)][1])["chains"]) for n in LENGTHS[TRANSLATION]}
        assert len(edges) == 1 and len(chains) == 1


# -- the contexts state the data in meta, and every query has its answer -----------------------------------


@pytest.mark.parametrize(("length", "index"), [(n, i) for n in LENGTHS[GRAPH] for i in INDICES])
def test_graph_context_states_the_graph_and_queries_are_answerable(length: int, index: int, made: Made) -> None:
    connected, shortest, longest = (made[(name, length, index)] for name in
                                    ("connected_nodes", "shortest_path", "longest_path"))
    meta = _meta(longest[1])
    n = meta["num_nodes"]
    assert n == (10, 15, 20)[index] and longest[1].complexity == f"nodes={n}"
    context = _context(longest[1])
    stated = [(int(u), int(v)) for u, v in EDGE.findall(context)]
    assert sorted(stated) == sorted(map(tuple, meta["edges"])) and len(set(stated)) == len(stated)
    selfs = SELF.findall(context)
    assert selfs and all(u == v and int(u) < n for u, v in selfs)
    rest = SELF.sub("", EDGE.sub("", context)).strip()
    assert rest == "The nodes in the graph are: " + ", ".join(f"Node {i}" for i in range(n)) + "."
    counts = np.bincount([int(u) for u, _ in selfs], minlength=n)
    assert counts.max() - counts.min() <= 10  # about as often: shuffled rounds, then a few swaps to fill the gap

    g = nx.DiGraph(stated)
    g.add_nodes_from(range(n))
    assert nx.is_directed_acyclic_graph(g)
    node = _meta(connected[1])["node"]
    assert connected[1].references == [", ".join(f"Node {v}" for v in sorted(g.successors(node)))]
    assert 0 <= connected[1].depth <= 100
    sp = _meta(shortest[1])
    source, target = sp["source"], sp["target"]
    if shortest[1].references == ["no path"]:
        assert not nx.has_path(g, source, target) and sp["distance"] is None and shortest[1].depth == -1
    else:
        assert sp["distance"] == nx.shortest_path_length(g, source, target) >= 2
        assert nx.is_path(g, sp["path"]) and 0 <= shortest[1].depth <= 100
    assert meta["longest_length"] == nx.dag_longest_path_length(g) == len(meta["path"]) - 1
    assert nx.is_path(g, meta["path"]) and longest[1].depth == -1


@pytest.mark.parametrize(("length", "index"), [(n, i) for n in LENGTHS[TRANSLATION] for i in INDICES])
def test_translation_context_states_each_dictionary_once(length: int, index: int, made: Made) -> None:
    single, multi, coverage = (made[(name, length, index)][1] for name in
                               ("single_hop_translation", "multi_hop_translation", "letter_coverage"))
    meta = _meta(coverage)
    n = meta["num_languages"]
    assert n == (3, 5, 7)[index] and coverage.complexity == f"languages={n}"
    context = _context(coverage)
    found = DICTIONARY.findall(context)
    assert [(int(a), int(b)) for a, b, _ in found] == [(i, i + 1) for i in range(n - 1)]
    tables = []
    for i, (_, _, entries) in enumerate(found):
        table = dict(entry.split(" -> ") for entry in entries.split("; "))
        assert table == {chain[i]: chain[i + 1] for chain in meta["chains"]} and len(table) == 50
        tables.append(table)
    lines = VOCABULARY.findall(context)
    assert [int(lang) for lang, _ in lines] == [k % n for k in range(len(lines))]
    assert all(set(words.rstrip(".").split(", ")) <= set(meta["source_vocabulary"])
               for lang, words in lines if lang == "0")
    for inst in (single, multi):
        m = _meta(inst)
        words = m["phrase"].split()
        assert 2 <= len(words) <= 5 and f'"{m["phrase"]}" from {m["source"]} to {m["target"]}' in inst.prompt
        source, target = int(m["source"][2:]), int(m["target"][2:])
        assert target - source == (1 if inst is single else m["hops"]) and (inst is single or m["hops"] >= 2)
        for hop in range(source, target):
            words = [tables[hop][w] for w in words]
        assert inst.references == [" ".join(words)]
        assert 0 <= inst.depth <= 100
    assert coverage.depth == -1


@pytest.mark.parametrize(("group", "length", "index"), CELLS)
def test_each_scorer_accepts_its_reference(group: str, length: int, index: int, made: Made) -> None:
    for inst in _cell(made, group, length, index):
        label = TASK_PROMPTS[inst.task].label
        output = f"Let me think.\nSo the answer follows.\n{label}: {inst.references[0]}"
        judged = SYNC_SCORERS[inst.metric](output, inst.references, _meta(inst))
        assert (judged.score, judged.error_type) == (1.0, ""), (inst.task, judged)
        wrong = SYNC_SCORERS[inst.metric](f"{label}: Node 99, Node 98", inst.references, _meta(inst))
        assert wrong.score == 0.0 and wrong.error_type


# -- prompt formats ---------------------------------------------------------------------------------------


def _with(spec: TaskSpec, **changes: object) -> TaskSpec:
    params = dataclasses.replace(spec.params, **changes)
    return dataclasses.replace(spec, params=params, max_new_tokens=max_new_tokens(params))


def test_without_cot_the_answer_label_is_prefilled(ctx: GenContext, encoder: Encoder) -> None:
    for group, tasks in GROUP_TASKS.items():
        insts = [run(ctx, _with(spec, cot=False), 8192, 2)[1] for spec in tasks]
        for inst in insts:
            label = TASK_PROMPTS[inst.task].label + ":"
            assert inst.answer_prefix == label and inst.prompt.endswith("<|im_start|>assistant\n" + label)
            assert "Think step by step" not in inst.prompt and "no explanation" in inst.prompt
            assert inst.max_new_tokens == DIRECT_MAX_NEW_TOKENS
            assert 0.99 * 8192 <= inst.input_tokens + inst.max_new_tokens <= 8192
            judged = SYNC_SCORERS[inst.metric](" " + inst.references[0] + "\nbecause ...", inst.references, _meta(inst))
            assert judged.score == 1.0, (group, inst.task, judged)
        shared = [i.prompt_token_ids[: len(i.prompt_token_ids) - _tail_tokens(encoder, i)] for i in insts]
        assert all(np.array_equal(shared[0], ids) for ids in shared[1:])


@pytest.mark.parametrize("fmt", [PromptFormat(chat_template=False), PromptFormat(reasoning=True),
                                 PromptFormat(answer_prefix=False)], ids=["plain", "reasoning", "no-prefix"])
def test_other_prompt_formats(fmt: PromptFormat, encoder: Encoder) -> None:
    ctx = GenContext(encoder=encoder, fmt=fmt)
    for tasks in GROUP_TASKS.values():
        insts = [run(ctx, _with(spec, cot=False), 8192, 0)[1] for spec in tasks]
        for inst in insts:
            assert inst.input_tokens + inst.max_new_tokens <= 8192
            assert list(inst.prompt_token_ids) == encoder.tokenizer.encode(inst.prompt, add_special_tokens=False)
            assert inst.answer_prefix == ("" if fmt.reasoning or not fmt.answer_prefix else inst.answer_prefix)
            assert ("<|im_start|>" in inst.prompt) == fmt.chat_template
        shared = [i.prompt_token_ids[: len(i.prompt_token_ids) - _tail_tokens(encoder, i)] for i in insts]
        assert all(np.array_equal(shared[0], ids) for ids in shared[1:])


def test_per_instance_data_still_shares_the_context(ctx: GenContext, encoder: Encoder) -> None:
    """dataset_seed=None draws the graph / languages from context_rng: the three tasks must still agree."""
    for tasks in GROUP_TASKS.values():
        insts = [run(ctx, _with(spec, dataset_seed=None), 4096, 5)[1] for spec in tasks]
        shared = [i.prompt_token_ids[: len(i.prompt_token_ids) - _tail_tokens(encoder, i)] for i in insts]
        assert all(np.array_equal(shared[0], ids) for ids in shared[1:])


def test_translation_questions_never_outgrow_the_reserved_tail(ctx: GenContext) -> None:
    """The context is sized for the widest possible question; random questions must fit under it."""
    for name in ("single_hop_translation", "multi_hop_translation"):
        for k in range(12):
            rng = np.random.default_rng([k, 99])
            _, inst = run(ctx, SPECS[name], 4096, 2, rng=rng)  # 7 languages; make_instance checks the length
            assert inst.input_tokens + inst.max_new_tokens <= 4096


# -- too short, and the registry ----------------------------------------------------------------------------


def test_lengths_that_cannot_hold_a_task_name_the_setting(ctx: GenContext) -> None:
    problems = []
    for spec in SYNC_TASKS:
        for length in (1024, 1300, 1600, 2048, 2600, 3000):
            try:
                _, inst = run(ctx, spec, length, 2)
            except LengthError as exc:
                if "suite.lengths" not in str(exc):
                    problems.append((spec.name, length, str(exc)))
            else:
                assert inst.input_tokens + inst.max_new_tokens <= length
    assert not problems
    with pytest.raises(LengthError, match="dictionaries"):
        run(ctx, SPECS["letter_coverage"], 2048, 2)


def test_registry() -> None:
    assert [s.name for s in SYNC_TASKS] == ["connected_nodes", "shortest_path", "longest_path",
                                            "single_hop_translation", "multi_hop_translation", "letter_coverage"]
    assert all(s.family == "sync" and s.key == f"sync/{s.name}" for s in SYNC_TASKS)
    assert {s.metric for s in SYNC_TASKS} == set(SYNC_SCORERS)
    assert all(s.context_group == CONTEXT_GROUPS[s.name] for s in SYNC_TASKS)
    assert all(s.max_new_tokens == COT_MAX_NEW_TOKENS for s in SYNC_TASKS)
    assert GraphParams() == GraphParams(num_nodes=(10, 15, 20), edge_density=0.15, cot=True)
    assert TranslationParams() == TranslationParams(num_languages=(3, 5, 7), vocabulary_size=250,
                                                    word_length=(3, 7), dictionary_size=50, phrase_length=(2, 5))
    assert max_new_tokens(GraphParams(cot=False)) == DIRECT_MAX_NEW_TOKENS


def test_meta_is_json_and_carries_what_the_scorer_needs(made: Made) -> None:
    needs: dict[str, Callable[[dict], bool]] = {
        "connected_nodes": lambda m: {"edges", "node", "successors"} <= set(m),
        "shortest_path": lambda m: {"edges", "source", "target", "distance"} <= set(m),
        "longest_path": lambda m: {"edges", "num_nodes", "longest_length"} <= set(m),
        "single_hop_translation": lambda m: {"phrase", "source", "target"} <= set(m),
        "multi_hop_translation": lambda m: {"phrase", "source", "target", "hops"} <= set(m),
        "letter_coverage": lambda m: {"chains", "source_vocabulary", "optimum"} <= set(m),
    }
    for (name, _, _), (_, inst) in made.items():
        meta = _meta(inst)
        assert needs[name](meta) and meta["cot"] is True and meta["answer_prefix"] == ""
        assert meta["prompt_fingerprint"] and meta["task"] == name
