"""SYNC prompt text, kept as data.

The context wording (instructions, node list, edge and no-self-cycle sentences, vocabularies, dictionaries)
and the six task questions follow the paper's Tables 1 and 2. The answer-format instructions are ours: the
paper's main setting is zero-shot chain-of-thought (§4, §5.2), so by default the model is asked to reason
and to end with one answer line we can parse; with `cot=False` the answer label is prefilled as the answer
prefix and the model must answer at once (§5.2 "we force the model to output the answer directly").

A prompt is `head + context + tail`. The head is the same for the three tasks of a domain, so their prompts
share the head and the context token for token; only the tail (question and answer format) differs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

PROMPT_VERSION = "1"

GRAPH_HEAD = (
    "You will answer a given question based on a directed acyclic graph. The edges of the graph are hidden "
    "within the following text. Make sure to memorize them. "
)
NODE_LIST = " The nodes in the graph are: {nodes}."
EDGE = " There is a directed edge from Node {source} to Node {target}."
NO_SELF_CYCLE = " There is no directed edge from Node {node} to Node {node}."

TRANSLATION_HEAD = (
    "Answer the question based on the given languages. These languages are created for special purposes and "
    "do not exist in the real world. Their vocabularies and bilingual dictionaries are as follows. Note that "
    "the vocabularies might be duplicated.\n\n"
)
VOCABULARY_HEADER = "\nThe vocabulary of {language}:"
DICTIONARY = "\nDictionary from {source} to {target}: {entries}."
DICTIONARY_ENTRY = "{source} -> {target}"


def language_name(i: int) -> str:
    """Languages are named LL0, LL1, ... as in the paper's Table 2."""
    return f"LL{i}"


@dataclass(frozen=True)
class TaskPrompt:
    """One task's question and the form of its answer line."""

    question: str
    label: str
    """The answer line starts with `label:`; with `cot=False` it is also the prefilled answer prefix."""
    form: str
    """What follows the label, as shown to the model."""
    note: str = ""
    """An extra sentence after the question (how to say that there is no path)."""


TASK_PROMPTS: dict[str, TaskPrompt] = {
    "connected_nodes": TaskPrompt(
        question="What are the nodes with directed edges from Node {node}?",
        label="Connected Nodes",
        form="Node a, Node b, ...",
    ),
    "shortest_path": TaskPrompt(
        question="What is the shortest path from Node {source} to Node {target}?",
        label="Shortest Path",
        form="Node a, Node b, ...",
        note=' If Node {target} cannot be reached from Node {source}, the answer is "Shortest Path: no path".',
    ),
    "longest_path": TaskPrompt(
        question="What is the longest path in the graph?",
        label="Longest Path",
        form="Node a, Node b, ...",
    ),
    "single_hop_translation": TaskPrompt(
        question='What is the translation of "{phrase}" from {source} to {target}?',
        label="Translation",
        form="the translated text",
    ),
    "multi_hop_translation": TaskPrompt(
        question='What is the translation of "{phrase}" from {source} to {target}?',
        label="Translation",
        form="the translated text",
    ),
    "letter_coverage": TaskPrompt(
        question=(
            "Find the three words in LL0 such that the union of the first letters of all their translations, "
            "across every other language, contains the maximum number of distinct letters."
        ),
        label="Words",
        form="word, word, word",
    ),
}

COT_INSTRUCTION = ' Think step by step, then give your final answer on the last line, in the form "{label}: {form}".'
DIRECT_INSTRUCTION = ' Give only the answer, with no explanation, in the form "{label}: {form}".'


def user_text(head: str, task: str, *, cot: bool, **fields: object) -> str:
    """The user message `{head}{context}\\n\\n{question}{note}{instruction}` for one task."""
    prompt = TASK_PROMPTS[task]
    instruction = (COT_INSTRUCTION if cot else DIRECT_INSTRUCTION).format(label=prompt.label, form=prompt.form)
    question = prompt.question.format(**fields) + prompt.note.format(**fields)
    return head + "{context}\n\n" + question + instruction


def answer_prefix(task: str, *, cot: bool) -> str:
    """Nothing with chain-of-thought (the model reasons first); the answer label without (§5.2)."""
    return "" if cot else TASK_PROMPTS[task].label + ":"


def prompt_fingerprint() -> str:
    """A hash of every template above: stored on each instance, so a wording change is never silent."""
    parts = [PROMPT_VERSION, GRAPH_HEAD, NODE_LIST, EDGE, NO_SELF_CYCLE, TRANSLATION_HEAD, VOCABULARY_HEADER,
             DICTIONARY, DICTIONARY_ENTRY, COT_INSTRUCTION, DIRECT_INSTRUCTION]
    for name in sorted(TASK_PROMPTS):
        p = TASK_PROMPTS[name]
        parts += [name, p.question, p.label, p.form, p.note]
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:12]
