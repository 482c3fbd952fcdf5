"""How fast each replica of a pool runs, measured from what it reports, and when work would finish where: the
estimates the work queue (`dispatch.WorkQueue`) shares work out and moves it by. Pure and single-threaded, like
the queue; it measures and estimates, the queue decides.

Three measures of each replica, over its current life (a replica started again is measured afresh): the cost it
ran per second since it first asked (`speeds`: what shares and the pool's projected end go by), the cost per
second of a prompt from hand-out to finish (`prompt_speed`: batch and all, not how much it runs at once), and the
tokens per second of one answer from the progress it reports (`left`: how long an answer has still to run).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from longeval.stages.infer.dispatch import Work

__all__ = ["MOVE_SPEEDUP", "SpeedEstimates", "clearly_faster"]

MOVE_SPEEDUP = 1.5
"""How much faster a replica must run (cost finished per second) than another to take that one's work
(`WorkQueue._ask_back`): clearly faster, so replicas of one speed, whose measured speeds differ by batch and noise,
do not trade work."""


class SpeedEstimates:
    """What each replica of a pool ran and how fast, from the queue's hand-outs and the replicas' reports; and from
    those, when a prompt would finish on one replica or another."""

    def __init__(self, replicas: int) -> None:
        self._first_ask: dict[int, float] = {}
        """When each replica first asked in its current life (`time.monotonic`, or the caller's clock)."""
        self._done_cost = dict.fromkeys(range(replicas), 0)
        """Cost each replica finished in its current life, and of what it gave back what it ran (`ran`)."""
        self._since: dict[str, float] = {}
        """When each prompt held was handed out."""
        self._latency: dict[int, list[float]] = {k: [0.0, 0.0] for k in range(replicas)}
        """Each replica's cost finished and the seconds its prompts took, hand-out to finish, in its current life:
        how fast it runs a prompt (`WorkQueue._ask_back`), batch and all, not how much it runs at once."""
        self._generated: dict[str, tuple[int, float]] = {}
        """Of each prompt held, the tokens its engine had generated at its replica's latest ask, and when."""
        self._decode: dict[int, list[float]] = {k: [0.0, 0.0] for k in range(replicas)}
        """Each replica's tokens generated per sequence and the seconds they took, from the progress it reports: how
        fast it generates one answer, batch and all (`WorkQueue._ask_back`)."""

    # -- what the queue tells it ---------------------------------------------------------------------------------

    def asked(self, replica: int, now: float) -> None:
        """`replica` asked for work: its life's clock starts at its first ask."""
        self._first_ask.setdefault(replica, now)

    def handed(self, unit: Iterable[Work], now: float) -> None:
        """These prompts were handed out at `now`."""
        self._since.update((w.instance_id, now) for w in unit)

    def finished(self, replica: int, instance_id: str, work: Work | None, now: float) -> None:
        """`replica` reported `instance_id` finished; `work`: the prompt, when the replica held it."""
        self._generated.pop(instance_id, None)
        if work is not None:
            self._done_cost[replica] += work.cost
            self._latency[replica][0] += work.cost
            self._latency[replica][1] += now - self._since.pop(instance_id, now)

    def gave_back(self, replica: int, work: Work, generated: int) -> None:
        """`replica` gave `work` back unfinished, `generated` tokens into its answer: its speed counts what it ran."""
        self._done_cost[replica] += self.ran(work, generated)
        self._since.pop(work.instance_id, None)
        self._generated.pop(work.instance_id, None)

    def forget(self, instance_ids: Iterable[str]) -> None:
        """Drop the progress and hand-out times of prompts let go (a prompt requeued starts from nothing, as its
        next engine does)."""
        for instance_id in instance_ids:
            self._generated.pop(instance_id, None)
            self._since.pop(instance_id, None)

    def new_life(self, replica: int) -> None:
        """`replica` died: it is measured afresh once started again."""
        self._latency[replica] = [0.0, 0.0]
        self._decode[replica] = [0.0, 0.0]
        self._first_ask.pop(replica, None)
        self._done_cost[replica] = 0

    def progress(self, replica: int, progress: Mapping[str, int], held: Collection[str], now: float) -> None:
        """Each prompt's tokens generated so far (of those `replica` holds, `held`), and from their growth since
        the last report the replica's tokens per second per sequence (the prefill's report, 0 tokens, is a
        starting point only)."""
        for instance_id, tokens in progress.items():
            if instance_id not in held:
                continue
            before = self._generated.get(instance_id)
            if before is not None and before[0] > 0 and tokens > before[0] and now > before[1]:
                self._decode[replica][0] += tokens - before[0]
                self._decode[replica][1] += now - before[1]
            self._generated[instance_id] = (tokens, now)

    # -- what it estimates ---------------------------------------------------------------------------------------

    def generated_tokens(self, instance_id: str) -> int:
        """Tokens the prompt's engine had generated at its replica's latest report (0 until one)."""
        return self._generated.get(instance_id, (0, 0.0))[0]

    def ran(self, work: Work, generated: int = 0) -> int:
        """How much of a held prompt's cost its engine ran: its prompt once it generated a token, and its tokens
        (`generated`, else as last reported)."""
        generated = generated or self.generated_tokens(work.instance_id)
        return work.prompt_cost + work.weight * min(generated, work.budget) if generated else 0

    def ran_of(self, works: Iterable[Work]) -> int:
        """What the engines ran of these prompts (`ran`)."""
        return sum(self.ran(w) for w in works)

    def left(self, work: Work, replica: int) -> float | None:
        """Seconds `replica` needs to finish `work` from where it is: its budget left at the replica's decode rate
        (an upper bound: an answer may stop before its budget); None until both are known."""
        tokens, seconds = self._decode[replica]
        generated = self.generated_tokens(work.instance_id)
        if not (work.budget and tokens and seconds > 0):
            return None
        return max(0, work.budget - generated) * seconds / tokens

    def answer_left(self, works: Iterable[Work], replica: int) -> float:
        """Seconds the longest of these answers `replica` holds has still to run there (`left`; 0 until known)."""
        return max((left for w in works if (left := self.left(w, replica)) is not None), default=0.0)

    def prompt_speed(self, replica: int) -> float | None:
        """Cost per second of a prompt on `replica` (its latency, hand-out to finish); None until it finished one."""
        cost, seconds = self._latency[replica]
        return cost / seconds if cost and seconds > 0 else None

    def speeds(self, now: float, held: Mapping[int, Iterable[Work]], ran: bool = True) -> dict[int, float] | None:
        """Each replica of `held` (the active ones, with the prompts each holds) and its cost run per second in its
        current life; None until every one has run something. Cost run: the prompts it finished and, by its
        engine's progress, what it ran of those it holds or gave back (`ran`). By finished cost alone a replica's
        first batch counts for nothing until its prompts finish, and what it gave back never: a benchmark run's slow
        replica measured 19 a second at 54 s (one prompt finished of eight prefilled), which put the pool's end at
        267 s (it ended at 168 s) so that its long answers were asked back only at 95 s, and after moves its share
        kept it at two or three prompts while the fast replica took the long answers left in the queue, and it ran
        out 21 s before the end. `ran=False`: the cost finished alone (what "clearly faster" goes by,
        `clearly_faster`)."""
        cost_run = {k: self._done_cost[k] + (self.ran_of(works) if ran else 0) for k, works in held.items()}
        speeds = {k: cost_run[k] / (now - self._first_ask[k]) for k in held
                  if k in self._first_ask and now > self._first_ask[k] and cost_run[k] > 0}
        return speeds if held and len(speeds) == len(held) else None

    def due(self, unit: list[Work], replica: int, now: float) -> float | None:
        """When a context `replica` holds would finish there: by its engine's progress once known (`left`: budget
        left at that replica's decode rate), else by how fast that replica has run its prompts (`prompt_speed`), a
        context past that time being taken to need as long again as it has run (LATE, Zaharia et al., OSDI 2008);
        None when neither a prompt finished there nor progress tells."""
        left = [self.left(w, replica) for w in unit]
        if None not in left:  # its engine's progress tells
            return now + max(left)
        their = self.prompt_speed(replica)
        if their is None:  # neither a prompt finished there nor progress: no estimate
            return None
        since = min(self._since[w.instance_id] for w in unit)
        due = since + sum(w.cost for w in unit) / their
        if due < now:  # overdue (a longer answer than that replica's average): as long again
            due = now + (now - since)
        return due

    def due_on(self, unit: list[Work], replica: int, now: float) -> float | None:
        """When a context another replica holds would finish were it moved to `replica`: a prefill of prompt and
        answer so far at its prompt speed (which errs long), then the rest of each answer at its decode rate; from
        scratch at its prompt speed until it reported progress. None until `replica` finished a prompt."""
        rate = self.prompt_speed(replica)
        if rate is None:
            return None
        mine = now + sum(w.cost for w in unit) / rate
        left = [self.left(w, replica) for w in unit]
        if None not in left:
            generated = sum(self.generated_tokens(w.instance_id) for w in unit)
            mine = now + (sum(w.prompt_cost for w in unit) + generated) / rate + max(left)
        return mine

    # -- what it shows ---------------------------------------------------------------------------------------------

    @property
    def decode(self) -> dict[int, tuple[float, float]]:
        """Each replica's tokens generated per sequence and the seconds they took."""
        return {k: (tokens, seconds) for k, (tokens, seconds) in self._decode.items()}

    def decode_rates(self) -> dict[int, float] | None:
        """Each replica's tokens a second per answer, for the queue's trace; None until any was measured."""
        if not any(tokens for tokens, _ in self._decode.values()):
            return None
        return {k: round(t / s, 2) for k, (t, s) in sorted(self._decode.items()) if s > 0}

    @property
    def generated(self) -> dict[str, tuple[int, float]]:
        """Of each prompt held, its tokens generated at the latest report, and when."""
        return dict(self._generated)

    @property
    def handed_out(self) -> dict[str, float]:
        """When each prompt held was handed out."""
        return dict(self._since)


def clearly_faster(replica: int, other: int, finished: dict[int, float], ran: dict[int, float], rate: float,
                   their: float | None) -> bool:
    """Whether `replica` runs `MOVE_SPEEDUP` times as fast as `other`: by the cost each finished per second
    (`finished`, `SpeedEstimates.speeds(ran=False)`: by cost run, a replica that prefilled its batch counts those
    prompts' prefills at once) once every replica finished something; before `other` finished anything, by the cost
    each ran (`ran`, `SpeedEstimates.speeds()`), so a slow replica's first batch can move while there is time (it
    finished its first prompt at 55-58 s in benchmark runs, and the long answers that then moved ended the pool
    15-20 s after it ran out); else by prompt speed (`rate`, `their`). Not by how fast answers grow (`decode`):
    that follows what else shares a step, and two replicas of one speed measured 2.5 and 0.6 tokens a second per
    answer in a benchmark run (prefills in one engine's steps), and traded work."""
    if replica in finished and other in finished:
        return finished[replica] >= MOVE_SPEEDUP * finished[other]
    if replica in ran and other in ran and their is None:
        return ran[replica] >= MOVE_SPEEDUP * ran[other]
    return their is not None and rate >= MOVE_SPEEDUP * their
