"""Michelangelo §2.3, IDK: does the model know what the context does not say?

A short invented story (people, pets, places, objects and some of their attributes) opens the context;
the rest is filler of random capital letters (Appendix A.3). The question asks for one attribute with
four choices, the last always "I don't know". In 70 % of the instances the story never states the
asked attribute, so "I don't know" is right (complexity 0, label "unknown"); in 30 % it states it once
(a simple retrieval, complexity 1, label "known"). The split is exact in every 10 consecutive indices.
The three other choices are values of the asked attribute's kind (three cities, three colours), none
of which the story mentions, except the right one when the attribute is known.

Scoring is accuracy with the paper's extra rule: when the right answer is "I don't know", an output
that picks no choice but says the information is not in the context also counts as right.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from longeval.errors import ConfigError, LengthError
from longeval.scoring.judgement import Judgement
from longeval.tasks.base import Draft, GenContext, context_budget, draft, fit_context
from longeval.tasks.michelangelo import prompts
from longeval.text.pieces import EMPTY, Piece, concat

LETTERS = "ABCD"
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Value pools, pairwise disjoint so that no story sentence can state another attribute's value.
PEOPLE = (("John", "his"), ("Maria", "her"), ("Daniel", "his"), ("Aisha", "her"), ("Tom", "his"),
          ("Sofia", "her"), ("Kenji", "his"), ("Lena", "her"), ("Omar", "his"), ("Grace", "her"),
          ("Pedro", "his"), ("Hannah", "her"))
FRIENDS = ("Marcus", "Beatrice", "Felix", "Nadia", "Oscar", "Ingrid", "Rafael", "Yvonne", "Stefan", "Priya",
           "Hugo", "Camille")
PET_NAMES = ("Biscuit", "Pepper", "Maple", "Shadow", "Noodle", "Ziggy", "Clover", "Bandit", "Mochi", "Rusty",
             "Pickle", "Juniper")
PETS = ("dog", "cat", "rabbit", "hamster")
COLORS = ("brown", "black", "white", "grey", "golden", "orange", "silver", "red", "green", "blue")
NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven")
CITIES = ("Fresno", "Berkeley", "Sacramento", "Denver", "Portland", "Austin", "Boston", "Chicago", "Seattle",
          "Toronto", "Dublin", "Lisbon")
WEATHER = ("sunny", "rainy", "windy", "foggy", "snowy", "cloudy", "stormy")
COMPANIES = ("Brightwave", "Northfield Labs", "Corvid Systems", "Tidewater Analytics", "Silverline",
             "Quarry Works", "Bluepine", "Halcyon Tech")
JOBS = ("software engineer", "nurse", "teacher", "accountant", "graphic designer", "electrician")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
TRANSPORT = ("train", "bus", "bicycle", "ferry", "tram", "plane")
SOUVENIRS = ("postcard", "scarf", "mug", "keychain", "painting", "hat", "fridge magnet")
MONTHS = ("January", "March", "April", "May", "June", "August", "October", "November")
DISHES = ("lasagna", "curry", "risotto", "paella", "dumplings", "ramen", "goulash", "tacos")
DESSERTS = ("cheesecake", "tiramisu", "apple pie", "chocolate cake", "lemon tart", "flan")
PRICES = ("$3,500", "$4,200", "$5,800", "$6,100", "$7,400", "$8,900")
YEARS = ("2008", "2010", "2011", "2013", "2014", "2016", "2017", "2019")


@dataclass(frozen=True)
class Attribute:
    name: str
    statement: str  # "{v}" is the value; {P}, {his}, {His}, {pet} the story's roles
    question: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Scenario:
    name: str
    intro: str
    attributes: tuple[Attribute, ...]


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("park", "{P} took {his} {pet} for a walk in the park.", (
        Attribute("pet_name", "The {pet} is called {v}.", "What is the name of {P}'s {pet}?", PET_NAMES),
        Attribute("pet_color", "The {pet} has {v} fur.", "What color is the fur of {P}'s {pet}?", COLORS),
        Attribute("pet_age", "The {pet} is {v} years old.", "How old is {P}'s {pet}?", NUMBERS),
        Attribute("city", "The park is in {v}.", "In which city is the park?", CITIES),
        Attribute("weather", "The weather that day was {v}.", "What was the weather like during the walk?",
                  WEATHER),
        Attribute("friend", "Near the fountain, {P} ran into an old friend named {v}.",
                  "What is the name of the friend {P} met in the park?", FRIENDS),
    )),
    Scenario("job", "{P} has been looking for a new job as a {job}.", (
        Attribute("company", "{His} favorite application went to a company called {v}.",
                  "Which company received {P}'s favorite application?", COMPANIES),
        Attribute("city", "The job is located in {v}.", "In which city is the job located?", CITIES),
        Attribute("day", "The interview is scheduled for {v}.", "On which day is {P}'s interview?", WEEKDAYS),
        Attribute("interviewer", "The interviewer's name is {v}.", "What is the name of the interviewer?", FRIENDS),
        Attribute("commute", "{P} plans to commute by {v}.", "How does {P} plan to commute?", TRANSPORT),
    )),
    Scenario("trip", "{P} and {his} cousin went on a trip together.", (
        Attribute("city", "They traveled to {v}.", "Which city did {P} and {his} cousin travel to?", CITIES),
        Attribute("transport", "They made the journey by {v}.", "How did {P} and {his} cousin travel?", TRANSPORT),
        Attribute("nights", "They stayed for {v} nights.", "How many nights did they stay?", NUMBERS),
        Attribute("souvenir", "{P} bought a {v} as a souvenir.", "What did {P} buy as a souvenir?", SOUVENIRS),
        Attribute("month", "The trip took place in {v}.", "In which month did the trip take place?", MONTHS),
        Attribute("door", "Their hotel had a {v} front door.", "What color was the front door of their hotel?",
                  COLORS),
    )),
    Scenario("dinner", "A group of friends, including {P}, gathered for dinner at a small restaurant.", (
        Attribute("host", "The dinner was organized by {v}.", "Who organized the dinner?", FRIENDS),
        Attribute("dish", "{P} ordered the {v}.", "Which dish did {P} order?", DISHES),
        Attribute("dessert", "For dessert, they shared a {v}.", "Which dessert did they share?", DESSERTS),
        Attribute("city", "The restaurant is in {v}.", "In which city is the restaurant?", CITIES),
        Attribute("day", "They met on a {v}.", "On which day of the week did they meet?", WEEKDAYS),
        Attribute("guests", "There were {v} people at the table.", "How many people were at the table?", NUMBERS),
    )),
    Scenario("car", "{P} recently bought a used car.", (
        Attribute("color", "The car is {v}.", "What color is {P}'s car?", COLORS),
        Attribute("seller", "{P} bought it from a neighbor named {v}.", "From whom did {P} buy the car?", FRIENDS),
        Attribute("price", "{P} paid {v} for it.", "How much did {P} pay for the car?", PRICES),
        Attribute("year", "The car was built in {v}.", "In which year was the car built?", YEARS),
        Attribute("city", "{P} drove it home to {v}.", "To which city did {P} drive the car home?", CITIES),
        Attribute("nickname", "{P} nicknamed the car {v}.", "What nickname did {P} give the car?", PET_NAMES),
    )),
)


@dataclass(frozen=True)
class IdkParams:
    """The paper's IDK split and filler."""

    unknown_per_10: int = 7
    """Instances per 10 consecutive indices whose answer is "I don't know" (the paper's 70 %)."""
    story_at_start: bool = True
    """The story opens the context as in Appendix A.3; False places it at a uniformly random depth."""

    def __post_init__(self) -> None:
        if not 0 <= self.unknown_per_10 <= 10:
            raise ConfigError(f"idk.unknown_per_10 must be in 0..10, got {self.unknown_per_10}")


def is_unknown(index: int, unknown_per_10: int = 7) -> bool:
    """Whether instance `index` asks for an absent attribute: exactly `unknown_per_10` of any 10
    consecutive indices do, spread evenly (index 0 is known when the share is 70 %)."""
    k = index % 10
    return ((k + 1) * unknown_per_10) // 10 - (k * unknown_per_10) // 10 == 1


def mentions(text: str, value: str) -> int:
    """How often a value occurs in a text as a whole word (case-insensitive)."""
    return len(re.findall(rf"(?<![\w$]){re.escape(value)}(?!\w)", text, flags=re.IGNORECASE))


@dataclass(frozen=True)
class Story:
    text: str
    scenario: str
    attribute: Attribute
    unknown: bool
    value: str | None  # the stated value of the asked attribute, None when unknown
    choices: tuple[str, str, str, str]
    answer: str  # "A".."D"
    question: str


def make_story(rng: np.random.Generator, unknown: bool) -> Story:
    """A story, a question about one of its scenario's attributes and four choices (D: I don't know)."""
    scenario = SCENARIOS[int(rng.integers(len(SCENARIOS)))]
    name, his = PEOPLE[int(rng.integers(len(PEOPLE)))]
    roles = {"P": name, "his": his, "His": his.capitalize(), "pet": PETS[int(rng.integers(len(PETS)))],
             "job": JOBS[int(rng.integers(len(JOBS)))]}
    asked = scenario.attributes[int(rng.integers(len(scenario.attributes)))]
    others = [a for a in scenario.attributes if a is not asked]
    stated = [others[i] for i in rng.choice(len(others), size=int(rng.integers(2, 4)), replace=False)]
    if not unknown:
        stated.insert(int(rng.integers(len(stated) + 1)), asked)
    sentences = [scenario.intro.format(**roles)]
    value = None
    for attribute in stated:
        v = attribute.values[int(rng.integers(len(attribute.values)))]
        sentences.append(attribute.statement.format(v=v, **roles))
        if attribute is asked:
            value = v
    text = " ".join(s[0].upper() + s[1:] for s in sentences)
    # Choices of the asked kind that the story never mentions (besides the right one, when known).
    free = [v for v in asked.values if v != value and mentions(text, v) == 0]
    picked = [free[i] for i in rng.choice(len(free), size=3 if value is None else 2, replace=False)]
    if value is not None:
        picked.insert(int(rng.integers(3)), value)
    choices = tuple(_display(v) for v in picked) + (prompts.IDK_UNKNOWN,)
    answer = "D" if value is None else LETTERS[picked.index(value)]
    return Story(text, scenario.name, asked, value is None, value, choices, answer,  # type: ignore[arg-type]
                 asked.question.format(**roles))


def _display(value: str) -> str:
    return value[0].upper() + value[1:]


def question_text(story: Story) -> str:
    choices = "\n".join(f"({letter}) {choice}" for letter, choice in zip(LETTERS, story.choices, strict=True))
    return prompts.IDK_QUESTION.format(question=story.question, choices=choices)


def _letters(ctx: GenContext) -> tuple[np.ndarray, np.ndarray] | None:
    """Token ids of " A" .. " Z" when each is one token (so filler ids are a lookup), else None."""

    def build() -> tuple[np.ndarray, np.ndarray] | None:
        ids = [ctx.encoder.encode(" " + c) for c in _ALPHABET]
        if any(len(i) != 1 for i in ids):
            return None
        return np.array([int(i[0]) for i in ids], dtype=np.int32), np.frombuffer(_ALPHABET.encode(), dtype=np.uint8)

    return ctx.cached(("michelangelo/idk/letters",), build)


def letter_filler(ctx: GenContext, n: int, rng: np.random.Generator) -> Piece:
    """`n` tokens of " W F D N ..." random capitals, built as arrays (a million letters in milliseconds)."""
    if n <= 0:
        return EMPTY
    table = _letters(ctx)
    picks = rng.integers(0, 26, size=n)
    if table is None:  # a tokenizer that splits " X": spell and encode (slow, but exact)
        text = "".join(" " + _ALPHABET[i] for i in picks)
        ids = ctx.encoder.encode(text)
        while len(ids) > n:
            text = text[:-2]
            ids = ctx.encoder.encode(text)
        return Piece(text, ids)
    ids, codes = table
    chars = np.full(2 * n, ord(" "), dtype=np.uint8)
    chars[1::2] = codes[picks]
    return Piece(chars.tobytes().decode("ascii"), ids[picks])


def generate(
    ctx: GenContext, params: IdkParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator | None = None,
) -> Draft:
    """One IDK instance: the story, letter filler to the exact length, the question and choices."""
    unknown = is_unknown(index, params.unknown_per_10)
    story = make_story(rng, unknown)
    frame = ctx.frame("{context}" + question_text(story), prompts.IDK_CUE)
    budget = context_budget(frame, target_length, max_new_tokens)
    fill_seed = int((context_rng if context_rng is not None else rng).integers(2**63))
    split = float(rng.random())
    placed: dict[str, int] = {}

    def build(room: int) -> Piece:
        frng = np.random.default_rng(fill_seed)
        if params.story_at_start:
            head = Piece(story.text, ctx.encoder.encode_followed(story.text, " X"))
            placed["offset"] = 0
            return concat([head, letter_filler(ctx, room - len(head), frng)])
        told = Piece(" " + story.text, ctx.encoder.encode_followed(" " + story.text, " X"))
        before = int(split * (room - len(told)))
        placed["offset"] = before
        return concat([letter_filler(ctx, before, frng), told, letter_filler(ctx, room - len(told) - before, frng)])

    if budget < len(ctx.encoder.encode(story.text)) + 1:
        raise LengthError(f"michelangelo/idk at {target_length}: the story and question need more than the "
                          f"{budget} tokens left; use larger suite.lengths values")
    context = fit_context(ctx.encoder, frame, budget, build)
    return draft(
        frame, context, [story.answer, story.choices[LETTERS.index(story.answer)]],
        depth=round(100.0 * placed["offset"] / max(1, len(context)), 2),
        complexity="unknown" if story.unknown else "known",
        meta={
            "unknown": story.unknown,
            "answer": story.answer,
            "choices": list(story.choices),
            "question": story.question,
            "scenario": story.scenario,
            "attribute": story.attribute.name,
            "value": story.value,
            "story": story.text,
            "prompt_fingerprint": prompts.fingerprint(),
        },
    )


# -- scoring ---------------------------------------------------------------------------------------

_SCAN_CHARS = 20_000
# Possessive quantifiers (`*+`, `?+`): each optional piece starts with a character the one before it cannot
# match, so giving characters back never finds a new match, and without it runs of spaces backtrack
# polynomially ("Answer" + 300 spaces + "?" took seconds, 2,000 spaces hours).
ANSWER_CUE = re.compile(
    r"(?i:answer|choice|option)\s*+(?i:is|would be)?+\s*+:?+\s*+\**+\s*+(?:\(([A-Da-d])\)|([A-D])(?![\w']))"
)
"""A letter after an "answer is" cue: `parse_choice`'s first rule (the last such cue wins)."""
ANSWER_AT_START = re.compile(r"\s*+\**+\s*+(?:\(([A-Da-d])\)|([A-D])[).:](?:\s|$)|([A-D])\s*+$)")
"""A letter the answer starts with ("B. Denver", "(c)"): `parse_choice`'s rule when no cue names one."""
_PAREN = re.compile(r"\(([A-Da-d])\)")
_NOT_IN_CONTEXT = re.compile(
    r"not (?:been )?(?:mentioned|stated|specified|provided|given|included|present|available|indicated|said)"
    r"|no (?:information|mention|indication|details?|data)"
    r"|(?:does|do|did)(?: not|n't) (?:say|mention|specify|state|provide|indicate|include|tell|contain|know)"
    r"|(?:cannot|can't|can not|unable to|impossible to) (?:be )?(?:determine|determined|answer|know|tell|say|infer)"
    r"|not (?:enough|sufficient) information|insufficient information|unknown|not possible to (?:know|determine)",
    re.IGNORECASE,
)


def _normalise(text: str) -> str:
    return text.replace("\u2019", "'").replace("\u2018", "'")


def parse_choice(output: str, choices: Sequence[str]) -> str | None:
    """The letter a model chose: after an "answer is" cue, at the start, in parentheses, or by the
    choice's own text; None when the output names no choice."""
    text = _normalise(output[-_SCAN_CHARS:] if len(output) > _SCAN_CHARS else output)
    cues = list(ANSWER_CUE.finditer(text))
    if cues:
        return next(g for g in cues[-1].groups() if g).upper()
    start = ANSWER_AT_START.match(text)
    if start:
        return next(g for g in start.groups() if g).upper()
    marked = _PAREN.findall(text)
    if marked:
        return marked[-1].upper()
    last, where = None, -1
    for letter, choice in zip(LETTERS, choices, strict=False):
        for match in re.finditer(rf"(?<!\w){re.escape(_normalise(choice))}(?!\w)", text, flags=re.IGNORECASE):
            if match.start() > where:
                last, where = letter, match.start()
    return last


def says_not_in_context(output: str) -> bool:
    """Whether the output states that the context does not give the answer."""
    text = _normalise(output[-_SCAN_CHARS:] if len(output) > _SCAN_CHARS else output)
    return _NOT_IN_CONTEXT.search(text) is not None


def score_idk(output: str, references: Sequence[str], meta: dict[str, Any]) -> Judgement:
    """Accuracy, with "not in the context" statements counting as "I don't know"; never raises."""
    answer = str(meta.get("answer", references[0] if references else "D"))
    choices = [str(c) for c in meta.get("choices", [])] or list(LETTERS)
    unknown = bool(meta.get("unknown", answer == "D"))
    chosen = parse_choice(str(output), choices)
    if chosen is None:
        if says_not_in_context(str(output)):
            return Judgement(1.0, "not in context", "") if unknown else Judgement(0.0, "not in context", "false_idk")
        return Judgement(0.0, "", "no_choice")
    if chosen == answer:
        return Judgement(1.0, chosen, "")
    if unknown:
        return Judgement(0.0, chosen, "hallucinated")  # picked a value the context never gave
    return Judgement(0.0, chosen, "false_idk" if chosen == "D" else "wrong_choice")
