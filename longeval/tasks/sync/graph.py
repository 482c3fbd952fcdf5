"""SYNC §3.1 and §4: three graph-understanding tasks on one shared context.

A random directed acyclic graph (10, 15 or 20 nodes, edge density 0.15, nodes labelled from 0) is told as
one sentence per edge ("There is a directed edge from Node i to Node j."), scattered among haystack sentences
that state there is no self-cycle at a node. The same context serves three tasks of rising difficulty:

- connected_nodes (retrieval): the out-neighbours of a queried node; exact set match.
- shortest_path (tracking): a shortest path between two nodes whose distance is more than one edge, or
  "no path"; every edge must exist and the length must be optimal.
- longest_path (global understanding): a longest path in the graph; every edge must exist and the length
  must equal the longest path's.

Graphs. Within a node count, the graphs of a suite are pairwise non-isomorphic (§4 "topologically unique"):
they are drawn one after another from a stream seeded by `dataset_seed`, each checked against the earlier
ones (a cheap invariant buckets them, an exact isomorphism test decides), and instance `i` takes graph
`i // len(num_nodes)` of its node count. So a 150-instance suite holds the paper's 50 graphs per node count,
and every length evaluates the same graphs, as in the paper. `dataset_seed=None` draws each graph from the
instance's `context_rng` instead (no uniqueness across instances).

Randomness. The graph (in `dataset_seed=None` mode) and the layout come from `context_rng` only, which the
pipeline makes identical for the three tasks; the query comes from the task's own `rng`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from longeval.errors import ConfigError
from longeval.tasks.base import Draft, GenContext, draft
from longeval.tasks.sync.layout import Layout, Rows, fit, insert, shared_budget, too_short
from longeval.tasks.sync.parsing import format_nodes
from longeval.tasks.sync.prompts import (
    EDGE,
    GRAPH_HEAD,
    NO_SELF_CYCLE,
    NODE_LIST,
    answer_prefix,
    prompt_fingerprint,
    user_text,
)
from longeval.text.pieces import close_gap
from longeval.text.render import Frame

if TYPE_CHECKING:
    import networkx as nx

GRAPH_TASKS = ("connected_nodes", "shortest_path", "longest_path")
_STREAM_TAG = 0x53594E4347  # "SYNCG": keeps the graph stream apart from other uses of dataset_seed
MAX_REJECTIONS = 20_000
"""Draws allowed for one graph (a new non-isomorphic one, or one with edges) before a `ConfigError` says what to
change: a sample count or edge density no graph can satisfy fails, rather than draws forever."""


@dataclass(frozen=True)
class GraphParams:
    """The paper's graph configuration (§4); one instance of each task per graph and length."""

    num_nodes: tuple[int, ...] = (10, 15, 20)
    """Node counts; instance `i` uses `num_nodes[i % len(num_nodes)]`, so a suite covers them evenly."""
    edge_density: float = 0.15
    """Probability that an edge joins two nodes (in the direction of a random topological order)."""
    no_path_share: float = 0.1
    """Share of shortest-path queries whose target is unreachable. The paper allows such pairs but gives no
    share; drawing uniformly among allowed pairs would make over 90 % of them unreachable at density 0.15
    (a one-phrase answer), so we draw a reachable pair at distance >= 2 otherwise, when the graph has one."""
    cot: bool = True
    """Zero-shot chain-of-thought (the paper's main setting); False prefills the answer label (§5.2)."""
    dataset_seed: int | None = 0
    """Seeds the stream of unique graphs shared by every length and run seed; None: per-instance graphs."""

    def __post_init__(self) -> None:
        if not self.num_nodes or any(int(n) < 3 for n in self.num_nodes):
            raise ConfigError(f"sync num_nodes must be a non-empty list of counts >= 3, got {self.num_nodes!r}")
        if not 0.0 < self.edge_density <= 1.0:
            raise ConfigError(f"sync edge_density must be in (0, 1], got {self.edge_density!r}")
        if not 0.0 <= self.no_path_share <= 1.0:
            raise ConfigError(f"sync no_path_share must be in [0, 1], got {self.no_path_share!r}")


# -- graphs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dag:
    """A directed acyclic graph on nodes 0..num_nodes-1; edges sorted."""

    num_nodes: int
    edges: tuple[tuple[int, int], ...]

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for u, v in self.edges:
            out[u].append(v)
        return tuple(tuple(sorted(s)) for s in out)

    @cached_property
    def edge_set(self) -> frozenset[tuple[int, int]]:
        return frozenset(self.edges)

    def invariant(self) -> tuple[Any, ...]:
        """Equal for isomorphic graphs: the sorted (in-degree, out-degree) pairs and the longest path length."""
        indeg = [0] * self.num_nodes
        for _, v in self.edges:
            indeg[v] += 1
        degrees = sorted(zip(indeg, (len(s) for s in self.successors), strict=True))
        return self.num_nodes, len(self.edges), tuple(degrees), longest_path_length(self)

    def to_networkx(self) -> nx.DiGraph:
        """The graph for networkx (imported here: only drawing unique graphs needs it)."""
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from(range(self.num_nodes))
        graph.add_edges_from(self.edges)
        return graph


def random_dag(num_nodes: int, edge_density: float, rng: np.random.Generator) -> Dag:
    """Each pair of nodes is joined with probability `edge_density`, from the earlier to the later node of
    a random topological order: so labels say nothing about the direction of an edge."""
    order = rng.permutation(num_nodes)
    keep = np.triu(rng.random((num_nodes, num_nodes)) < edge_density, k=1)
    rows, cols = np.nonzero(keep)
    edges = sorted((int(order[i]), int(order[j])) for i, j in zip(rows, cols, strict=True))
    return Dag(num_nodes, tuple(edges))


class DagStream:
    """Pairwise non-isomorphic DAGs with at least one edge, drawn one after another.

    Graph `k` depends only on the seed, never on how many graphs are asked for later, so a cached stream
    can grow as a suite asks for more instances.
    """

    def __init__(self, num_nodes: int, edge_density: float, rng: np.random.Generator) -> None:
        self.num_nodes, self.edge_density, self.rng = num_nodes, edge_density, rng
        self.dags: list[Dag] = []
        self._buckets: dict[tuple[Any, ...], list[nx.DiGraph]] = {}

    def __getitem__(self, k: int) -> Dag:
        while len(self.dags) <= k:
            self.dags.append(self._next())
        return self.dags[k]

    def _next(self) -> Dag:
        import networkx as nx

        for _ in range(MAX_REJECTIONS):
            dag = random_dag(self.num_nodes, self.edge_density, self.rng)
            if not dag.edges:
                continue
            bucket = self._buckets.setdefault(dag.invariant(), [])
            graph = dag.to_networkx()
            if any(nx.is_isomorphic(graph, other) for other in bucket):
                continue
            bucket.append(graph)
            return dag
        raise ConfigError(
            f"found only {len(self.dags)} non-isomorphic DAGs with {self.num_nodes} nodes at edge density "
            f"{self.edge_density}; ask for fewer samples or use more nodes"
        )


def unique_dags(num_nodes: int, edge_density: float, count: int, rng: np.random.Generator) -> list[Dag]:
    """`count` pairwise non-isomorphic DAGs (the paper draws 50 per node count)."""
    stream = DagStream(num_nodes, edge_density, rng)
    return [stream[k] for k in range(count)]


def dataset_rng(dataset_seed: int, num_nodes: int, edge_density: float) -> np.random.Generator:
    return np.random.default_rng([dataset_seed, _STREAM_TAG, num_nodes, round(edge_density * 1_000_000)])


def instance_dag(ctx: GenContext, params: GraphParams, index: int, context_rng: np.random.Generator) -> Dag:
    """The graph of instance `index`: from the shared unique stream, or from `context_rng`."""
    n = int(params.num_nodes[index % len(params.num_nodes)])
    if params.dataset_seed is None:
        for _ in range(MAX_REJECTIONS):
            dag = random_dag(n, params.edge_density, context_rng)
            if dag.edges:
                return dag
        raise ConfigError(f"sync edge_density {params.edge_density} gives graphs without edges; raise it")
    key = ("sync-dag-stream", n, params.edge_density, params.dataset_seed)
    stream = ctx.cached(key, lambda: DagStream(n, params.edge_density,
                                               dataset_rng(params.dataset_seed, n, params.edge_density)))
    return stream[index // len(params.num_nodes)]


# -- paths ----------------------------------------------------------------------------------------------


def distances_from(dag: Dag, source: int) -> dict[int, int]:
    """Edges on a shortest path from `source` to every node it reaches (breadth-first)."""
    dist = {source: 0}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        for v in dag.successors[u]:
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def shortest_path(dag: Dag, source: int, target: int) -> list[int] | None:
    """One shortest path (the first found breadth-first, smaller labels first), or None."""
    parent: dict[int, int | None] = {source: None}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        if u == target:
            path = [u]
            while (p := parent[path[-1]]) is not None:
                path.append(p)
            return path[::-1]
        for v in dag.successors[u]:
            if v not in parent:
                parent[v] = u
                queue.append(v)
    return None


def topological_order(dag: Dag) -> list[int]:
    indeg = [0] * dag.num_nodes
    for _, v in dag.edges:
        indeg[v] += 1
    ready = deque(u for u in range(dag.num_nodes) if indeg[u] == 0)
    order = []
    while ready:
        u = ready.popleft()
        order.append(u)
        for v in dag.successors[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return order


def longest_path(dag: Dag) -> list[int]:
    """One longest path, by dynamic programming over a topological order (linear time)."""
    best = [0] * dag.num_nodes
    before: list[int | None] = [None] * dag.num_nodes
    for u in topological_order(dag):
        for v in dag.successors[u]:
            if best[u] + 1 > best[v]:
                best[v], before[v] = best[u] + 1, u
    end = max(range(dag.num_nodes), key=lambda u: (best[u], -u))
    path = [end]
    while (p := before[path[-1]]) is not None:
        path.append(p)
    return path[::-1]


def longest_path_length(dag: Dag) -> int:
    return len(longest_path(dag)) - 1


def is_path(edges: frozenset[tuple[int, int]] | set[tuple[int, int]], nodes: list[int]) -> bool:
    """Whether every consecutive pair of `nodes` is an edge (a single node is a path of length 0)."""
    return bool(nodes) and all((a, b) in edges for a, b in zip(nodes, nodes[1:], strict=False))


# -- queries --------------------------------------------------------------------------------------------


def connected_query(dag: Dag, rng: np.random.Generator) -> int:
    """A node with at least one out-edge, at random (an empty answer set would test nothing)."""
    candidates = [u for u in range(dag.num_nodes) if dag.successors[u]]
    return int(candidates[int(rng.integers(len(candidates)))])


def path_query(dag: Dag, rng: np.random.Generator, no_path_share: float) -> tuple[int, int]:
    """A (source, target) pair that is not one edge apart: unreachable, or at distance >= 2 (§3.1)."""
    far, unreachable = [], []
    for u in range(dag.num_nodes):
        dist = distances_from(dag, u)
        for v in range(dag.num_nodes):
            if v == u or dist.get(v) == 1:
                continue
            (far if v in dist else unreachable).append((u, v))
    want_unreachable = rng.random() < no_path_share
    pool = unreachable if (want_unreachable and unreachable) or not far else far
    return pool[int(rng.integers(len(pool)))]


# -- context --------------------------------------------------------------------------------------------


def _rows(ctx: GenContext, dag: Dag) -> Rows:
    """Row 0: the node list; rows 1..n: the no-self-cycle sentence of node row-1; then one row per edge."""
    n = dag.num_nodes
    texts = [NODE_LIST.format(nodes=", ".join(f"Node {i}" for i in range(n)))]
    texts += [NO_SELF_CYCLE.format(node=i) for i in range(n)]
    texts += [EDGE.format(source=u, target=v) for u, v in dag.edges]
    return Rows.of(texts, ctx.encoder.encode_many(texts))


def _haystack_nodes(lengths: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
    """Nodes whose no-self-cycle sentences fill `budget` tokens: rounds of shuffled nodes, so every node is
    mentioned about as often, then the longest sentences that still fit and swaps that close the gap."""
    n = len(lengths)
    count = budget // int(lengths.min()) + 1
    order = np.argsort(rng.random((count // n + 1, n)), axis=1).ravel()
    total = np.cumsum(lengths[order])
    k = int(np.searchsorted(total, budget, side="right"))
    chosen = order[:k].tolist()
    gap = budget - (int(total[k - 1]) if k else 0)
    while gap >= lengths.min():
        fits = np.nonzero(lengths <= gap)[0]
        pick = int(fits[np.argmax(lengths[fits])])
        chosen.append(pick)
        gap -= int(lengths[pick])
    chosen, _ = close_gap(lengths, chosen, list(range(n)) * 4, gap)
    return np.asarray(chosen, dtype=np.int64)


def graph_layout(ctx: GenContext, dag: Dag, budget: int, seed: int, target_length: int) -> Layout:
    """The context within `budget` tokens; `fact_starts[k]` is where edge `dag.edges[k]` starts."""
    rows = _rows(ctx, dag)
    n, e = dag.num_nodes, len(dag.edges)
    fixed = int(rows.lengths[0] + rows.lengths[n + 1 :].sum())
    if fixed > budget:
        raise too_short(f"the node list and the {e} edges", fixed, budget, target_length)
    rng = np.random.default_rng(seed)
    haystack = np.concatenate([[0], 1 + _haystack_nodes(rows.lengths[1 : n + 1], budget - fixed, rng)])
    edge_order = rng.permutation(e)
    slots = np.sort(rng.integers(1, len(haystack) + 1, size=e))
    placed = insert(rows, haystack, n + 1 + edge_order, slots)
    starts = np.empty(e, dtype=np.int64)
    starts[edge_order] = placed.fact_starts
    return Layout(placed.context, starts)


# -- prompts --------------------------------------------------------------------------------------------


def _frame(ctx: GenContext, task: str, cot: bool, **fields: object) -> Frame:
    return ctx.frame(user_text(GRAPH_HEAD, task, cot=cot, **fields), answer_prefix(task, cot=cot))


def widest_frame(ctx: GenContext, num_nodes: int, cot: bool) -> Frame:
    """The frame with the most overhead over every task and every query of an n-node graph (cached)."""

    def build() -> Frame:
        frames = [_frame(ctx, "longest_path", cot)]
        frames += [_frame(ctx, "connected_nodes", cot, node=u) for u in range(num_nodes)]
        frames += [_frame(ctx, "shortest_path", cot, source=u, target=v)
                   for u in range(num_nodes) for v in range(num_nodes) if u != v]
        return max(frames, key=lambda f: f.overhead)

    return ctx.cached(("sync-graph-widest", ctx.fmt, num_nodes, cot, prompt_fingerprint()), build)


# -- generators -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Query:
    fields: dict[str, int]
    references: list[str]
    facts: list[int]  # edges (indices into dag.edges) the answer rests on, for the depth
    meta: dict[str, Any]


def _query(task: str, dag: Dag, params: GraphParams, rng: np.random.Generator) -> _Query:
    index = {edge: k for k, edge in enumerate(dag.edges)}
    if task == "connected_nodes":
        node = connected_query(dag, rng)
        out = list(dag.successors[node])
        return _Query({"node": node}, [format_nodes(out)], [index[(node, v)] for v in out],
                      {"node": node, "successors": out})
    if task == "shortest_path":
        source, target = path_query(dag, rng, params.no_path_share)
        path = shortest_path(dag, source, target)
        return _Query(
            {"source": source, "target": target},
            [format_nodes(path) if path else "no path"],
            [index[(a, b)] for a, b in zip(path, path[1:], strict=False)] if path else [],
            {"source": source, "target": target, "distance": len(path) - 1 if path else None, "path": path},
        )
    path = longest_path(dag)
    return _Query({}, [format_nodes(path)], [], {"longest_length": len(path) - 1, "path": path})


def _generate(
    task: str, ctx: GenContext, params: GraphParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    # context_rng is consumed in the same order by the three tasks: the graph, then the layout seed.
    dag = instance_dag(ctx, params, index, context_rng)
    layout_seed = int(context_rng.integers(2**63))
    query = _query(task, dag, params, rng)
    frame = _frame(ctx, task, params.cot, **query.fields)
    budget = shared_budget([widest_frame(ctx, dag.num_nodes, params.cot)], target_length, max_new_tokens)
    layout = fit(ctx, frame, budget, lambda b: graph_layout(ctx, dag, b, layout_seed, target_length))
    meta = {
        "task": task, "domain": "graph", "num_nodes": dag.num_nodes, "edges": [list(e) for e in dag.edges],
        "cot": params.cot, "answer_prefix": frame.answer_prefix, "prompt_fingerprint": prompt_fingerprint(),
        **query.meta,
    }
    return draft(frame, layout.context, query.references, depth=layout.depth(query.facts),
                 complexity=f"nodes={dag.num_nodes}", meta=meta)


def generate_connected_nodes(
    ctx: GenContext, params: GraphParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    """Connected Node (retrieval): which nodes have an edge from the queried node."""
    return _generate("connected_nodes", ctx, params, target_length=target_length, max_new_tokens=max_new_tokens,
                     rng=rng, index=index, context_rng=context_rng)


def generate_shortest_path(
    ctx: GenContext, params: GraphParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    """Shortest Path (tracking): a shortest path between two nodes, or that there is none."""
    return _generate("shortest_path", ctx, params, target_length=target_length, max_new_tokens=max_new_tokens,
                     rng=rng, index=index, context_rng=context_rng)


def generate_longest_path(
    ctx: GenContext, params: GraphParams, *, target_length: int, max_new_tokens: int,
    rng: np.random.Generator, index: int, context_rng: np.random.Generator,
) -> Draft:
    """Longest Path (global understanding): a longest path anywhere in the graph."""
    return _generate("longest_path", ctx, params, target_length=target_length, max_new_tokens=max_new_tokens,
                     rng=rng, index=index, context_rng=context_rng)
