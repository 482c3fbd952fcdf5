"""SYNC graph domain, without a tokenizer: the random DAGs, their uniqueness, the path algorithms, the queries."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from longeval.errors import ConfigError
from longeval.tasks.base import GenContext
from longeval.tasks.sync import graph
from longeval.tasks.sync.graph import (
    Dag,
    GraphParams,
    connected_query,
    distances_from,
    instance_dag,
    is_path,
    longest_path,
    longest_path_length,
    path_query,
    random_dag,
    shortest_path,
    unique_dags,
)


def _nx(dag: Dag) -> nx.DiGraph:
    return dag.to_networkx()


def _all_paths(dag: Dag) -> list[list[int]]:
    """Every path with at least one node, by depth-first search (small graphs only)."""
    paths: list[list[int]] = []

    def extend(path: list[int]) -> None:
        paths.append(path)
        for v in dag.successors[path[-1]]:
            extend([*path, v])

    for u in range(dag.num_nodes):
        extend([u])
    return paths


# -- graphs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [10, 15, 20])
def test_random_dags_are_acyclic_with_nodes_from_zero(n: int) -> None:
    rng = np.random.default_rng(n)
    backwards = 0
    for _ in range(100):
        dag = random_dag(n, 0.15, rng)
        g = _nx(dag)
        assert nx.is_directed_acyclic_graph(g)
        assert sorted(g.nodes) == list(range(n))
        assert all(u != v for u, v in dag.edges)
        assert len(set(dag.edges)) == len(dag.edges) and list(dag.edges) == sorted(dag.edges)
        backwards += sum(u > v for u, v in dag.edges)
    assert backwards > 0  # labels are not a topological order: edge direction is not given away


def test_edge_density_is_the_papers() -> None:
    rng = np.random.default_rng(7)
    n, pairs, edges = 15, 0, 0
    for _ in range(400):
        edges += len(random_dag(n, 0.15, rng).edges)
        pairs += n * (n - 1) // 2
    assert edges / pairs == pytest.approx(0.15, abs=0.01)


@pytest.mark.parametrize("n", [10, 15, 20])
def test_fifty_graphs_are_pairwise_non_isomorphic(n: int) -> None:
    dags = unique_dags(n, 0.15, 50, graph.dataset_rng(0, n, 0.15))
    graphs = [_nx(d) for d in dags]
    assert all(d.edges for d in dags)
    for a, b in itertools.combinations(range(50), 2):
        if graphs[a].number_of_edges() == graphs[b].number_of_edges():
            assert not nx.is_isomorphic(graphs[a], graphs[b]), (a, b)


def test_isomorphic_duplicates_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relabelled copies of one graph are all the same graph: the stream keeps only the first."""
    base = random_dag(8, 0.4, np.random.default_rng(1))
    perms = np.random.default_rng(2)

    def relabelled(num_nodes: int, edge_density: float, rng: np.random.Generator) -> Dag:
        p = perms.permutation(num_nodes)
        return Dag(num_nodes, tuple(sorted((int(p[u]), int(p[v])) for u, v in base.edges)))

    monkeypatch.setattr(graph, "random_dag", relabelled)
    monkeypatch.setattr(graph, "MAX_REJECTIONS", 30)
    stream = graph.DagStream(8, 0.4, np.random.default_rng(0))
    assert stream[0].invariant() == base.invariant()
    with pytest.raises(ConfigError, match="non-isomorphic"):
        stream[1]


def test_the_stream_does_not_depend_on_how_many_graphs_follow() -> None:
    first = unique_dags(10, 0.15, 10, graph.dataset_rng(3, 10, 0.15))
    more = unique_dags(10, 0.15, 30, graph.dataset_rng(3, 10, 0.15))
    assert more[:10] == first


def test_instances_cycle_node_counts_and_share_graphs_across_lengths() -> None:
    params = GraphParams()
    ctx = GenContext(encoder=None)  # type: ignore[arg-type]  # graphs need no tokenizer
    dags = [instance_dag(ctx, params, i, np.random.default_rng(i)) for i in range(150)]
    assert [d.num_nodes for d in dags[:6]] == [10, 15, 20, 10, 15, 20]
    for n in (10, 15, 20):
        group = [_nx(d) for d in dags if d.num_nodes == n]
        assert len(group) == 50
        for a, b in itertools.combinations(group, 2):
            assert a.number_of_edges() != b.number_of_edges() or not nx.is_isomorphic(a, b)
    again = instance_dag(GenContext(encoder=None), params, 17, np.random.default_rng(999))  # type: ignore[arg-type]
    assert again == dags[17]  # the context rng (length, run seed) does not change the graph


def test_per_instance_graphs_come_from_the_context_rng() -> None:
    params = GraphParams(dataset_seed=None)
    ctx = GenContext(encoder=None)  # type: ignore[arg-type]
    a = instance_dag(ctx, params, 4, np.random.default_rng(5))
    assert a == instance_dag(ctx, params, 4, np.random.default_rng(5))
    assert a.num_nodes == 15 and a.edges
    assert a != instance_dag(ctx, params, 4, np.random.default_rng(6))


@pytest.mark.parametrize("bad", [dict(num_nodes=()), dict(num_nodes=(2,)), dict(edge_density=0.0),
                                 dict(edge_density=1.5), dict(no_path_share=-0.1)])
def test_bad_parameters_say_what_is_wrong(bad: dict) -> None:
    with pytest.raises(ConfigError, match="sync"):
        GraphParams(**bad)


# -- paths ----------------------------------------------------------------------------------------------


def test_path_algorithms_match_brute_force() -> None:
    rng = np.random.default_rng(11)
    for _ in range(150):
        dag = random_dag(int(rng.integers(3, 9)), float(rng.uniform(0.1, 0.6)), rng)
        paths = _all_paths(dag)
        longest = longest_path(dag)
        assert is_path(dag.edge_set, longest)
        assert len(longest) - 1 == max(len(p) - 1 for p in paths) == longest_path_length(dag)
        assert longest_path_length(dag) == nx.dag_longest_path_length(_nx(dag))
        for u, v in itertools.permutations(range(dag.num_nodes), 2):
            between = [p for p in paths if p[0] == u and p[-1] == v]
            found = shortest_path(dag, u, v)
            if not between:
                assert found is None and v not in distances_from(dag, u)
            else:
                assert found is not None and is_path(dag.edge_set, found) and found[0] == u and found[-1] == v
                assert len(found) - 1 == min(len(p) - 1 for p in between) == distances_from(dag, u)[v]


def test_is_path() -> None:
    edges = frozenset({(0, 1), (1, 2)})
    assert is_path(edges, [0, 1, 2]) and is_path(edges, [1])
    assert not is_path(edges, []) and not is_path(edges, [0, 2]) and not is_path(edges, [2, 1])


# -- queries --------------------------------------------------------------------------------------------


def test_queries_are_answerable_or_provably_without_a_path() -> None:
    rng = np.random.default_rng(5)
    for n in (10, 15, 20):
        for dag in unique_dags(n, 0.15, 20, graph.dataset_rng(1, n, 0.15)):
            node = connected_query(dag, rng)
            assert dag.successors[node]
            g = _nx(dag)
            for share in (0.0, 0.1, 1.0):
                source, target = path_query(dag, rng, share)
                assert source != target and (source, target) not in dag.edge_set
                if nx.has_path(g, source, target):
                    assert nx.shortest_path_length(g, source, target) >= 2
                    assert share < 1.0 or not _has_unreachable_pair(dag)
                else:
                    assert share > 0.0 or not _has_far_pair(dag)


def _has_far_pair(dag: Dag) -> bool:
    return any(d >= 2 for u in range(dag.num_nodes) for d in distances_from(dag, u).values())


def _has_unreachable_pair(dag: Dag) -> bool:
    return any(len(distances_from(dag, u)) < dag.num_nodes for u in range(dag.num_nodes))


def test_no_path_share_is_honoured() -> None:
    rng = np.random.default_rng(9)
    dags = unique_dags(20, 0.15, 40, graph.dataset_rng(2, 20, 0.15))
    unreachable = 0
    draws = 0
    for dag in dags:
        if not _has_far_pair(dag):
            continue
        for _ in range(25):
            source, target = path_query(dag, rng, 0.1)
            unreachable += shortest_path(dag, source, target) is None
            draws += 1
    assert unreachable / draws == pytest.approx(0.1, abs=0.04)
