"""Our RULER prompts against the text RULER's own generator writes, task by task (issue #12).

RULER's scripts cannot run here (its data needs the network, its code its own dependencies), so each test
rebuilds, as a literal string, the text RULER's code would produce for the same contents (keys, values,
numbers of noise lines, word lists, documents) as one of our instances, and asserts that our prompt is that
text. The literals were derived by reading RULER at commit c3f5e3b (NVIDIA/RULER): the template and answer
prefix of scripts/data/synthetic/constants.py (TASKS), joined by scripts/data/prepare.py with the 'base'
model template of scripts/data/template.py (`"{task_template}" + answer_prefix`); each generator is cited at
its test. Prompts are rendered without a chat template (RULER's 'base' format).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from longeval.records import Instance
from longeval.tasks import get_task
from longeval.tasks.base import DataPaths, GenContext, instance_rng, make_instance, output_budget
from longeval.tasks.ruler import RULER_TASKS
from longeval.text import words
from longeval.text.corpus import NOISE
from longeval.text.render import PromptFormat
from longeval.text.ruler_format import RULER_MODEL_TEMPLATES
from longeval.text.tokenizer import Encoder, load_encoder
from tests.nltk_punkt import nltk_data, write_punkt_tab
from tests.qa_fixtures import hotpotqa_file, squad_file  # noqa: F401

LENGTH = 2048
NEEDLE = re.compile(r"One of the special magic (?:numbers|uuids) for .+? is: \S+\.")
ENTRY = re.compile(r"\d+\. (.+?)(?= \d+\. |$)")
"""A numbered word of CWE's list: RULER's words may hold a space ("creme brulee", "ad hoc")."""

# RULER's NIAH template + answer prefix after its singular rewrite (niah.py, generate_input_output: with
# num_needle_q * num_needle_v == 1, Some->A, 'are all'->is, are->is, answers->answer, type_needle_v[:-1]).
NIAH_SINGULAR = (
    "A special magic {t} is hidden within the following text. Make sure to memorize it. I will quiz you about "
    "the {t} afterwards.\n{context}\nWhat is the special magic {t} for {query} mentioned in the provided text? "
    "The special magic {t} for {query} mentioned in the provided text is"
)
NIAH_PLURAL = (
    "Some special magic {t} are hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the {t} afterwards.\n{context}\nWhat are all the special magic {t} for {query} mentioned in the "
    "provided text? The special magic {t} for {query} mentioned in the provided text are"
)
VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above. Answer: According to "
    "the chain(s) of variable assignment in the text above, 5 variables are assigned the value {query}, they "
    "are: "
)
CWE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list? Answer: "
    "The top 10 words that appear most often in the list are:"
)
FWE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text? Answer: According to the coded "
    "text above, the three most frequently appeared words are:"
)
QA = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:"
)


def _fill(template: str, **values: str) -> str:
    """str.format without reading braces inside the values (as RULER's template.format)."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


@pytest.fixture(scope="module")
def encoder(smollm2_path: Path) -> Encoder:
    return load_encoder(str(smollm2_path))


@pytest.fixture(scope="module")
def ctx(encoder: Encoder, squad_file: Path, hotpotqa_file: Path) -> GenContext:  # noqa: F811
    data = DataPaths(squad_path=str(squad_file), hotpotqa_path=str(hotpotqa_file))
    return GenContext(encoder=encoder, fmt=PromptFormat(chat_template=False), data=data)


def _instance(ctx: GenContext, name: str, index: int = 5, length: int = LENGTH) -> Instance:
    spec = get_task(name)
    draft = spec.generate(ctx, spec.params, target_length=length, max_new_tokens=output_budget(spec, ctx.fmt, length),
                          rng=instance_rng(7, spec.key, length, index), index=index)
    return make_instance(spec, draft, ctx, target_length=length, seed=7, shard_index=0, index=index)


def _between(text: str, before: str, after: str) -> str:
    start = text.index(before) + len(before)
    return text[start : text.rindex(after)]


def _query(inst: Instance) -> str:
    keys = json.loads(inst.meta)["keys"]
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


# -- NIAH (scripts/data/synthetic/niah.py, generate_input_output) --------------------------------------------


@pytest.mark.parametrize(("name", "kind"), [("niah_single_1", "number"), ("niah_multikey_2", "number"),
                                            ("niah_multikey_3", "uuid")])
def test_line_haystacks_are_rulers_text(name: str, kind: str, ctx: GenContext) -> None:
    """Noise and needle haystacks: `"\\n".join(sentences)` of whole noise paragraphs / needles, singular wording."""
    inst = _instance(ctx, name)
    assert _check_lines(inst, inst.prompt, name, kind) == inst.prompt


def _check_lines(inst: Instance, prompt: str, name: str, kind: str) -> str:
    context = _between(prompt, "afterwards.\n", "\nWhat is the special")
    lines = context.split("\n")
    if name == "niah_single_1":  # sentences = [haystack] * num_haystack, the needle inserted among them
        needle = next(ln for ln in lines if ln != NOISE)
        at = lines.index(needle)
        sentences = [NOISE] * (len(lines) - 1)
        sentences.insert(at, needle)
    else:  # sentences = distractor needles, plus the asked one inserted
        sentences = [ln for ln in lines if NEEDLE.fullmatch(ln)]
    assert len(sentences) == len(lines) > 10
    return _fill(NIAH_SINGULAR, t=kind, context="\n".join(sentences), query=_query(inst))


@pytest.fixture(scope="module", autouse=True)
def nltk_punkt_tab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`_sent_tokenize` is RULER's call through nltk's own loader, not through `longeval.text.corpus`."""
    with nltk_data(write_punkt_tab(tmp_path_factory.mktemp("nltk_data"))) as root:
        yield root


def _sent_tokenize(text: str) -> list[str]:
    """RULER's `from nltk.tokenize import sent_tokenize`, English, loaded from `punkt_tab` as nltk loads it."""
    from nltk.tokenize import sent_tokenize

    return sent_tokenize(text)


def _ruler_essay_context(haystack: list[str], needles: list[str], depths: list[float]) -> str:
    """niah.py, generate_input_output, essay branch, line by line (the needles already in RULER's shuffled order,
    i.e. the order of the positions they get)."""
    text = " ".join(haystack)
    document_sents = _sent_tokenize(text.strip())
    insertion_positions = [0] + \
        sorted([int(len(document_sents) * (depth / 100)) for depth in depths]) + \
        [len(document_sents)]
    document_sents_list = []
    for i in range(1, len(insertion_positions)):
        last_pos = insertion_positions[i - 1]
        next_pos = insertion_positions[i]
        document_sents_list.append(" ".join(document_sents[last_pos:next_pos]))
        if i - 1 < len(needles):
            document_sents_list.append(needles[i - 1])
    return " ".join(document_sents_list)


def _check_essay_placement(inst: Instance, template: str, kind: str, corpus_words: list[str], prompt: str = "") -> str:
    """Our prompt (or `prompt`, its task text) is RULER's for the same haystack words, needles and depths; returns
    the context."""
    prompt = prompt or inst.prompt
    after = "\nWhat is the special" if template is NIAH_SINGULAR else "\nWhat are all the special"
    context = _between(prompt, "afterwards.\n", after)
    assert "\n" not in context  # RULER: re.sub(r'\s+', " ", essay)
    needles = NEEDLE.findall(context)
    depths = json.loads(inst.meta)["depths"]
    assert len(needles) == len(depths)
    haystack = NEEDLE.sub(" ", context).split()
    assert haystack == corpus_words[: len(haystack)]  # RULER's haystack[:num_haystack]
    expected = _fill(template, t=kind, context=_ruler_essay_context(haystack, needles, depths), query=_query(inst))
    assert prompt == expected
    # The asked needle sits at the instance's depth: the first key's needle ranks where its depth does.
    key = json.loads(inst.meta)["keys"][0]
    ranks = [i for i, n in enumerate(needles) if f" for {key} is: " in n]
    assert sorted(depths).index(inst.depth) in ranks
    return context


ESSAY_TASKS = [("niah_single_2", NIAH_SINGULAR, "number"), ("niah_single_3", NIAH_SINGULAR, "uuid"),
               ("niah_multikey_1", NIAH_SINGULAR, "number"), ("niah_multivalue", NIAH_PLURAL, "numbers"),
               ("niah_multiquery", NIAH_PLURAL, "numbers")]


@pytest.fixture(scope="module")
def corpus_words() -> list[str]:
    from longeval.text.corpus import load_essays

    return " ".join(load_essays().sentences).split()


@pytest.mark.parametrize("length", [4096, 16384])
@pytest.mark.parametrize(("name", "template", "kind"), ESSAY_TASKS)
def test_essay_needles_sit_where_rulers_placement_puts_them(
    name: str, template: str, kind: str, length: int, ctx: GenContext, corpus_words: list[str]
) -> None:
    """Needles between sentences, `" ".join` of sentence runs and needles: at depth 0 the context starts with the
    join's space ("\\n One of"), at depth 100 the needle follows the cut last sentence and a space ("... \\nWhat")."""
    for index in (0, 7, 19, 20, 39):  # depths 0, 18, 49, 51, 100
        inst = _instance(ctx, name, index=index, length=length)
        context = _check_essay_placement(inst, template, kind, corpus_words)
        if index == 0:
            assert context.startswith(" One of the special magic")
        if index == 39:
            assert re.search(NEEDLE.pattern + " $", context)  # after the cut last sentence, then the join's space
        if 0 < index < 39 and len(json.loads(inst.meta)["depths"]) == 1:  # a lone needle amid sentences
            assert not context.startswith(" ") and not context.endswith(" ")


def test_needles_at_one_sentence_boundary_are_two_spaces_apart(encoder: Encoder, tmp_path: Path) -> None:
    """Long sentences (word-chunked into several units) make few sentences, so two depths can fall on the same
    boundary: RULER's empty run between them leaves two spaces; no needle ever sits inside a long sentence."""
    folder = tmp_path / "essays"
    folder.mkdir()
    sentence = " ".join(f"{w}{i}" for i in range(30) for w in ("alpha", "beta", "gamma")).capitalize()
    text = " ".join(f"{sentence} number {j}." for j in range(300))
    (folder / "long.txt").write_text(text, encoding="utf-8")
    ctx = GenContext(encoder=encoder, fmt=PromptFormat(chat_template=False), data=DataPaths(essay_dir=str(folder)))
    words = " ".join(text.split()).split()
    doubled = 0
    for index in range(12):
        inst = _instance(ctx, "niah_multikey_1", index=index, length=4096)
        context = _check_essay_placement(inst, NIAH_SINGULAR, "number", words)
        doubled += ".  One of the special" in context or context.startswith("  One of")
        for m in NEEDLE.finditer(context):  # between sentences, or after the cut last one
            assert m.start() <= 1 or context[: m.start()].rstrip().endswith(".") or m.end() >= len(context) - 1
    assert doubled  # the case is exercised


# -- VT (scripts/data/synthetic/variable_tracking.py) ----------------------------------------------------------


def test_vt_is_rulers_text(ctx: GenContext, encoder: Encoder) -> None:
    """Lines `"\\n".join(sentences)`; the example (sys_vartrack_w_noise_random at max_seq_length=500) is
    `input + " " + " ".join(outputs) + "\\n"`, put before the task with another '\\n'."""
    inst = _instance(ctx, "vt")
    assert _check_vt(inst, inst.prompt, encoder) == inst.prompt


def _check_vt(inst: Instance, prompt: str, encoder: Encoder) -> str:
    example, task = prompt.split("\n\nMemorize and track", 1)
    task = "Memorize and track" + task
    icl_context = _between(example, "in the following text.\n\n", "\nQuestion: Find all")
    icl_value = re.search(r"VAR [A-Z]{3} = (\d{5})\n", icl_context).group(1)
    icl_names = [n for n in re.findall(r"\b[A-Z]{3}\b", icl_context) if n != "VAR"]
    icl_chain = list(dict.fromkeys(icl_names))
    assert len(icl_chain) == 5
    icl_filled = _fill(VT, context=icl_context, query=icl_value)
    assert example == icl_filled + " " + " ".join(icl_chain)  # "they are:  ABC ..." (two spaces)
    assert "they are:  " in example
    # Filled to RULER's 500 tokens: one more noise line would not fit.
    assert encoder.count(icl_filled) <= 500 < encoder.count(icl_filled) + encoder.count(NOISE + "\n")
    for lines in (icl_context.split("\n"), _between(task, "text.\n\n", "\nQuestion:").split("\n")):
        assert all(ln == NOISE or re.fullmatch(r"VAR [A-Z]+ = (\d{5}|VAR [A-Z]+ )", ln) for ln in lines)
        assert lines[-1] == NOISE  # RULER inserts statements before noise lines only
    value = json.loads(inst.meta)["value"]
    context = _between(task, "text.\n\n", "\nQuestion:")
    assert task == _fill(VT, context=context, query=value)
    return icl_filled + " " + " ".join(icl_chain) + "\n" + "\n" + _fill(VT, context=context, query=value)


# -- CWE (scripts/data/synthetic/common_words_extraction.py, generate_input_output) ---------------------------


def _check_cwe(inst: Instance, length: int, wrap: tuple[str, str] = ("", "")) -> list[str]:
    """The CWE prompt is RULER's for the same words, in RULER's model template `wrap` (its text before and after
    {task_template}; each shot is `Templates[...].format(...) + answer_prefix` filled, + ' ' + answer); returns the
    task's listed words."""
    head = CWE.split("{context}")[0]
    before, after = wrap
    assert inst.prompt.startswith(before)
    shot, task = inst.prompt[len(before) :].split("\n" + before + head, 1)
    task = head + task
    example_context = _between(shot, head, "\nQuestion:")
    answer = shot.rsplit("in the list are: ", 1)[1]
    common = ENTRY.findall(answer)
    assert answer == " ".join(f"{i + 1}. {w}" for i, w in enumerate(common)) and len(common) == 10
    words = ENTRY.findall(example_context)
    assert example_context == " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
    assert len(words) == (40 if length < 4096 else 10 * 10 + 30 * 3)  # get_example(20, 3, 1) / (40, 10, 3)
    context = _between(task, "most often.\n", "\nQuestion:")
    items = ENTRY.findall(context)
    assert context == " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))
    prefix = " Answer: The top 10 words"
    expected = (before + _fill(CWE, context=example_context).replace(prefix, after + prefix) + " " + answer + "\n"
                + before + _fill(CWE, context=context).replace(prefix, after + prefix))
    assert inst.prompt == expected
    return items


@pytest.mark.parametrize("length", [2048, 4096])
def test_cwe_is_rulers_text(length: int, ctx: GenContext) -> None:
    """`few_shots + "\\n" + input_text`, each shot `template.format(context) + ' ' + '1. w 2. w ...'`."""
    _check_cwe(_instance(ctx, "cwe", length=length), length)


def test_cwe_words_with_a_space_are_listed_as_ruler_lists_them(ctx: GenContext) -> None:
    """RULER's vocabulary keeps wonderwords' "creme brulee", "ad hoc", ...: one numbered entry each."""
    spaced = {w for w in words.common_vocabulary() if " " in w}
    for index in range(60):
        items = _check_cwe(_instance(ctx, "cwe", index=index, length=4096), 4096)
        found = spaced & set(items)
        if found:
            inst = _instance(ctx, "cwe", index=index, length=4096)
            assert any(f". {w} " in inst.prompt or inst.prompt.endswith(f". {w}") for w in found)
            return
    pytest.fail(f"no CWE instance among 60 listed any of {sorted(spaced)}")


# -- FWE (scripts/data/synthetic/freq_words_extraction.py, generate_input_output) ------------------------------


def test_fwe_is_rulers_text(ctx: GenContext) -> None:
    """`template.format(context=' '.join(sampled_words))`, the top-ranked word being vocab[0] = '...'."""
    inst = _instance(ctx, "fwe")
    assert _check_fwe(inst.prompt) == inst.prompt


def _check_fwe(prompt: str) -> str:
    context = _between(prompt, "coded words. ", "\nQuestion:")
    words = context.split(" ")
    assert all(w == "..." or re.fullmatch(r"[a-z]{6}", w) for w in words)
    assert max(set(words), key=words.count) == "..." and "...." not in words
    return _fill(FWE, context=" ".join(words))


# -- QA (scripts/data/synthetic/qa.py, generate_input_output) --------------------------------------------------


@pytest.mark.parametrize("name", ["qa_1", "qa_2"])
def test_qa_is_rulers_text(name: str, ctx: GenContext) -> None:
    """`'\\n\\n'.join(DOCUMENT_PROMPT.format(i=i + 1, document=d))`, DOCUMENT_PROMPT = "Document {i}:\\n{document}".

    Documents are read as RULER's read_squad / read_hotpotqa do; ours may end with a cut distractor (kept on
    purpose, see docs/tasks/ruler.md), so the last one need only be a prefix of a document.
    """
    inst = _instance(ctx, name)
    assert _check_qa(inst, inst.prompt, name, ctx) == inst.prompt


def _check_qa(inst: Instance, prompt: str, name: str, ctx: GenContext) -> str:
    from longeval.tasks.ruler.qa import load_qa

    data = load_qa("squad" if name == "qa_1" else "hotpotqa",
                   ctx.data.squad_path if name == "qa_1" else ctx.data.hotpotqa_path)
    context = _between(prompt, "given documents.\n\n", "\n\nAnswer the question based")
    bodies = re.split(r"(?:^|\n\n)Document \d+:\n", context)[1:]
    docs = set(data.docs)
    assert all(b in docs for b in bodies[:-1]) and len(bodies) > 3
    assert any(d.startswith(bodies[-1]) for d in docs)
    rebuilt = "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(bodies))
    return _fill(QA, context=rebuilt, query=json.loads(inst.meta)["query"])


# -- RULER-format mode: every task in every RULER model template (scripts/data/prepare.py) ---------------------


def _task_text(name: str, inst: Instance, prompt: str, ctx: GenContext, corpus_words: list[str]) -> str:
    """RULER's base-format text for the contents of `prompt` (a task text and its answer prefix), by task."""
    if name in ("niah_single_1", "niah_multikey_2", "niah_multikey_3"):
        return _check_lines(inst, prompt, name, "uuid" if name == "niah_multikey_3" else "number")
    if name == "vt":
        return _check_vt(inst, prompt, ctx.encoder)
    if name == "fwe":
        return _check_fwe(prompt)
    if name in ("qa_1", "qa_2"):
        return _check_qa(inst, prompt, name, ctx)
    _, template, kind = next(t for t in ESSAY_TASKS if t[0] == name)
    _check_essay_placement(inst, template, kind, corpus_words, prompt)
    return prompt


@pytest.mark.parametrize("template", sorted(RULER_MODEL_TEMPLATES))
def test_every_task_in_every_ruler_template_is_rulers_text(
    template: str, encoder: Encoder, squad_file: Path, hotpotqa_file: Path, corpus_words: list[str],  # noqa: F811
) -> None:
    """`Templates[t].format(task_template=template) + answer_prefix`, filled: the task text between the
    template's two halves, the answer prefix after; VT's example inside the turn (variable_tracking.py inserts it
    after the model template's head); CWE's example a turn of its own (its shots format the wrapped template)."""
    data = DataPaths(squad_path=str(squad_file), hotpotqa_path=str(hotpotqa_file))
    ctx = GenContext(encoder=encoder, fmt=PromptFormat(chat_template=False, ruler_template=template), data=data)
    before, after = RULER_MODEL_TEMPLATES[template].split("{task_template}")
    for spec in RULER_TASKS:
        inst = _instance(ctx, spec.name)
        assert json.loads(inst.meta)["prompt_format"]["ruler_template"] == template
        assert encoder.decode(inst.prompt_token_ids) == inst.prompt
        assert list(inst.prompt_token_ids) == encoder.tokenizer.encode(inst.prompt, add_special_tokens=False)
        if spec.name == "cwe":
            _check_cwe(inst, LENGTH, (before, after))
            continue
        prefix = inst.answer_prefix
        assert prefix and inst.prompt.startswith(before) and inst.prompt.endswith(after + prefix), spec.name
        task = inst.prompt[len(before) : len(inst.prompt) - len(after + prefix)]
        assert before + _task_text(spec.name, inst, task + prefix, ctx, corpus_words)[: -len(prefix)] + after \
            + prefix == inst.prompt
