"""The Lost in the Middle family (Liu et al., 2023): the worked example of docs/adding-a-family.md.

Its tasks and `FAMILY` are declared here, with no side effect at import; `plugin.py` registers it, the way a
user's package does (`plugins=[tests.example_family.plugin]`). A built-in family adds `FAMILY` to the tuple in
`longeval/tasks/__init__.py` instead.
"""

from longeval.scoring.string_match import judge_all
from longeval.tasks.base import TaskSpec
from longeval.tasks.family import Family, borrowed_threshold
from tests.example_family.kv_retrieval import KvParams, generate

TASKS = (
    TaskSpec("lost_in_the_middle", "kv_retrieval", KvParams(), generate, "string_match_all", 64, judge=judge_all),
)

FAMILY = Family(
    name="lost_in_the_middle",
    title="Lost in the Middle",
    threshold=borrowed_threshold("Lost in the Middle"),
    tasks=TASKS,
    intro="Key-value retrieval from a JSON object of UUID pairs (Liu et al., 2023, §4): the share of answers that "
          "contain the queried value, ×100. Read the depth x length heatmap: the paper's U-shape is low scores in "
          "the middle depths.",
)
