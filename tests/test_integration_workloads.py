"""benchmarks/workloads.py: the benchmark prompts and the ShareGPT split the chat datastore rests on."""
from __future__ import annotations

import json

import pytest

from benchmarks import workloads as wl


def conversation(rid: str, *turns: str) -> dict:
    roles = ["human", "gpt"] * len(turns)
    return {"id": rid, "conversations": [{"from": r, "value": t} for r, t in zip(roles, turns)]}


def records(n: int) -> list[dict]:
    return [conversation(f"c{i:04d}_0", f"question number {i} please answer it",
                         f"answer {i} " * 40, f"Rewrite the answer {i} shorter", f"short {i}")
            for i in range(n)]


def test_truncated_sharegpt_file_recovers_complete_records(tmp_path):
    recs = records(5)
    text = json.dumps(recs, indent=1)
    cut = text.index('"c0004_0"') + 30  # mid-way through the last record
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:cut], encoding="utf-8")
    got = list(wl.sharegpt_records(path))
    assert [r["id"] for r in got] == [r["id"] for r in recs[:4]]
    assert got == recs[:4]


def test_split_keeps_every_part_of_a_conversation_on_one_side():
    ids = [f"conv{i}_{part}" for i in range(3000) for part in (0, 7, 19)]
    side = {}
    for rid in ids:
        side.setdefault(wl.base_id(rid), set()).add(wl.is_heldout(rid))
    assert all(len(s) == 1 for s in side.values())
    heldout = sum(s == {True} for s in side.values()) / len(side)
    assert 0.01 < heldout < 0.03  # HELDOUT_PER_MILLE = 20
    assert wl.is_heldout("conv5_0") == wl.is_heldout("conv5_0")  # a pure function of the id


def test_corpus_holds_only_the_datastore_part(tmp_path):
    recs = records(400)
    out = tmp_path / "train.jsonl"
    counts = wl.write_sharegpt_corpus(out, recs)
    lines = [json.loads(x)["text"] for x in out.read_text(encoding="utf-8").splitlines()]
    train = [r for r in recs if not wl.is_heldout(r["id"])]
    held = [r for r in recs if wl.is_heldout(r["id"])]
    assert held and counts["heldout"] == len(held)
    assert lines == [t["value"] for r in train for t in r["conversations"] if t["from"] == "gpt"]
    heldout_answers = {t["value"] for r in held for t in r["conversations"] if t["from"] == "gpt"}
    assert not heldout_answers & set(lines)
    prompts = wl.chat(1000, records=recs)
    assert {p.id for p in prompts} == {r["id"] for r in held}
    assert all(p.chat and p.kind == "chat" for p in prompts)


def test_revisions_and_code_references(smollm2_tokenizer):
    recs = records(400)
    rev = wl.sharegpt_revisions(3, smollm2_tokenizer, records=recs)
    assert len(rev) == 3
    for p in rev:
        assert not p.chat and p.references and p.references[0] in p.text
        assert p.text.rstrip().endswith("assistant")  # ends on the generation prompt
        assert wl.is_heldout(p.id.split("/")[0])
    code = wl.code_references(4)
    assert len(code) == 4 and len({p.id for p in code}) == 4
    for p in code:
        assert p.references[0] in p.text and p.references[0].lstrip().startswith("def ")
        ids = wl.encode(p, smollm2_tokenizer)
        assert smollm2_tokenizer.decode(ids).count("<|im_start|>") >= 2  # system/user + assistant


def test_humaneval_prompts_in_task_order(smollm2_tokenizer):
    prompts = wl.humaneval(12)
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(12)]
    ids = wl.encode(prompts[0], smollm2_tokenizer)
    assert smollm2_tokenizer.decode(ids) == prompts[0].text


def test_empty_prompt_rejected():
    with pytest.raises(ValueError):
        wl.Prompt("x", "")
