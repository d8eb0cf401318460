"""bench_drafters' peer column and fixed-budget variants, without a model: which decoders a run
makes, and what the markdown says with and without SuffixDecoding built."""
from __future__ import annotations

import pytest

from benchmarks import bench_drafters as bdr


def test_variants_add_the_fixed_budget_runs():
    s = bdr.DraftersBenchSettings(methods=("ngram", "default", bdr.PEER))
    assert s.variants == ["ngram", "default", bdr.PEER, "default@64", f"{bdr.PEER}@64"]
    assert bdr.DraftersBenchSettings(methods=("default",), fixed_budget=0).variants == ["default"]
    assert bdr.DraftersBenchSettings(methods=("default",), budget=64).variants == ["default"]
    with pytest.raises(ValueError):
        bdr.DraftersBenchSettings(fixed_budget=-1)


def test_method_drafters():
    assert bdr.method_drafters("default") == ["retrieval", "longest", "reference", "ngram", "recycle"]
    assert bdr.method_drafters("default@64") == bdr.method_drafters("default")
    assert bdr.method_drafters("all") == list(bdr.SOURCES)
    assert bdr.uses_store(f"{bdr.PEER}@64") and bdr.uses_store("all") and not bdr.uses_store("ngram")
    assert bdr.uses_store("longest") and bdr.uses_store("default@64")


def summary(tps, tok_s, speedup, nodes):
    return {"summary": {"tokens_per_step": tps, "tokens_per_second": tok_s, "speedup": speedup, "identical": 1,
                        "prompts": 1, "mean_tree_budget": nodes, "step_cost_vs_greedy_step": 1.0}}


def results(peer: dict, methods: dict) -> dict:
    return {
        "settings": {"max_new_tokens": 8, "budget": "auto", "fixed_budget": 64,
                     "default_sources": list(bdr.DEFAULT_SOURCES)},
        "machine": {"cpus": 2, "processor": "x", "load_average_1min": 0},
        "created": "now",
        "stores": {"code": {"which": "stdlib", "tokens": 10}, "chat": {"path": "p", "tokens": 20}},
        "workloads": {"code": {"prompts": 1, "prompt_ids": ["a"], "dtypes": {
            "float32": {"greedy_tokens_per_second": 20.0, "methods": methods, "prompts": []}}}},
        "verdicts": {},
        "peer": peer,
    }


def test_markdown_compares_ours_with_the_peer():
    methods = {"default": summary(3.0, 50.0, 2.5, 10.0), bdr.PEER: summary(2.0, 40.0, 2.0, 3.5),
               "default@64": summary(5.0, 30.0, 1.5, 63.0), f"{bdr.PEER}@64": summary(2.5, 39.0, 1.9, 4.0)}
    res = results({"requested": True, "built": True, "version": "0.3.0", "settings": {
        "max_tree_depth": 24, "max_spec_factor": 1.0, "min_token_prob": 0.1, "use_tree_spec": True},
        "corpus": {"code": {"tokens": 10, "documents": 2, "fill_seconds": 0.1, "peak_rss_growth_bytes": 0}}},
        methods)
    rows = bdr.peer_comparison(res)
    assert len(rows) == 1 and rows[0]["ours"]["fixed"]["tokens_per_step"] == 5.0
    assert rows[0]["ratios"]["tokens_per_step_fixed"] == pytest.approx(2.0)
    assert rows[0]["targets"]["tokens_per_second"][2] and rows[0]["targets"]["tokens_per_step_fixed"][2]
    md = bdr.markdown(res)
    assert "| code | float32 | ours (default) | 3.00 | 10.0 | 50.0 | 2.50x | 1/1 | 5.00 | 63.0 |" in md
    assert "| code | float32 | SuffixDecoding | 2.00 | 3.5 | 40.0 | 2.00x | 1/1 | 2.50 | 4.0 |" in md
    assert "**2.00x**" in md and "**1.25x**" in md


def test_markdown_says_make_peers_when_the_peer_is_not_built():
    res = results({"requested": True, "built": False, "why": "no module"}, {"default": summary(3.0, 50.0, 2.5, 10)})
    md = bdr.markdown(res)
    assert "run `make peers`" in md and bdr.peer_comparison(res) == []
    assert "SuffixDecoding" not in bdr.markdown(results({"requested": False}, {"default": summary(3, 5, 2, 1)}))


def test_ours_is_compared_with_the_peer_at_its_faster_setting():
    """SuffixDecoding's whole tree verified (the fixed budget, as vLLM verifies it) can beat its
    drafts cut by our cost model: the tok/s verdict takes the faster of the two."""
    methods = {"default": summary(3.0, 50.0, 2.5, 10.0), bdr.PEER: summary(2.0, 40.0, 2.0, 3.5),
               "default@64": summary(5.0, 30.0, 1.5, 63.0), f"{bdr.PEER}@64": summary(2.5, 55.0, 2.7, 4.0)}
    res = results({"requested": True, "built": True, "settings": {}}, methods)
    row = bdr.peer_comparison(res)[0]
    assert row["peer_best"] == "fixed" and row["ratios"]["tokens_per_second"] == pytest.approx(50 / 55)
    assert not row["targets"]["tokens_per_second"][2]
