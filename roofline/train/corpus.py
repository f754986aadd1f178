"""A real corpus every machine has without a download: the Python standard library's sources.

Files are the `.py` files under `sysconfig.get_paths()["stdlib"]` (site-packages and the test
suites left out; `pydoc_data/topics.py`, the bundled documentation topics, is one of them),
split into train / held-out BY PATH: a file's split is decided by a hash of its relative path,
so the split is deterministic, needs no list, and a held-out file is never seen in training.
The held-out files split again, by path, into two disjoint prompt sets: "a" (acceptance
measured for the prediction) and "b" (the engine's validation points).

Each file becomes a chat: the user turn names the file and gives its first lines, the
assistant turn continues it. Training text is the chats rendered through the chat template
(roofline.train.tokenizer), so the model is trained on the very format its prompts arrive in.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from roofline.io.fields import ConfigError

SKIP_PARTS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"}
HEAD_LINES = 12  # lines of the file in the user turn
FILE_BYTES = 32_000  # a training file's share: its first lines up to this many characters


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str, heldout_percent: int) -> str:
    """'train', 'a' or 'b' from a hash of the path alone (the held-out share split in two)."""
    h = int.from_bytes(hashlib.blake2b(relpath.encode(), digest_size=8).digest(), "little")
    if h % 100 >= heldout_percent:
        return "train"
    return "a" if (h // 100) % 2 == 0 else "b"


@dataclass(frozen=True)
class Corpus:
    root: str
    files: dict[str, list[str]]  # split -> relative paths, sorted

    def fingerprint(self) -> str:
        """blake2b of the sorted file lists: two runs on the same Python read the same corpus."""
        return hashlib.blake2b(json.dumps(self.files, sort_keys=True).encode(), digest_size=8).hexdigest()


def list_corpus(root: str | Path | None = None, heldout_percent: int = 10) -> Corpus:
    root = Path(root) if root else stdlib_root()
    if not root.is_dir():
        raise ConfigError(f"corpus_root={str(root)!r}: no such folder")
    if not 1 <= heldout_percent <= 50:
        raise ConfigError(f"heldout_percent={heldout_percent}: allowed 1..50")
    files: dict[str, list[str]] = {"train": [], "a": [], "b": []}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_PARTS)  # never walk site-packages
        for name in sorted(filenames):
            if name.endswith(".py"):
                rel = (Path(dirpath) / name).relative_to(root).as_posix()
                files[split_of(rel, heldout_percent)].append(rel)
    files = {k: sorted(v) for k, v in files.items()}
    if not files["train"] or not files["a"] or not files["b"]:
        raise ConfigError(f"corpus_root={str(root)!r}: too few .py files for a train / held-out split")
    return Corpus(str(root), files)


def read(corpus: Corpus, rel: str) -> str:
    return (Path(corpus.root) / rel).read_text(encoding="utf-8", errors="replace")


def as_chat(rel: str, text: str, head_lines: int = HEAD_LINES, answer_chars: int | None = None) -> list[dict]:
    """The file as a conversation: its path and first lines asked, the rest answered."""
    lines = text.splitlines(keepends=True)
    head, rest = "".join(lines[:head_lines]), "".join(lines[head_lines:])
    if answer_chars is not None:
        rest = rest[:answer_chars]
    return [{"role": "user", "content": f"Continue {rel}:\n{head}"},
            {"role": "assistant", "content": rest}]


def _hash_order(rel: str) -> bytes:
    return hashlib.blake2b(b"order:" + rel.encode(), digest_size=8).digest()


def training_chats(corpus: Corpus, max_bytes: int, file_bytes: int = FILE_BYTES) -> list[list[dict]]:
    """Train-split files as chats until max_bytes of source are taken: in an order drawn from a
    hash of the path (deterministic, and every package is represented, where path order took
    the first packages of the alphabet: half of the files were encodings/ tables), each file
    cut after the line that reaches file_bytes (so one large file does not fill the corpus)."""
    out, used = [], 0
    for rel in sorted(corpus.files["train"], key=_hash_order):
        if used >= max_bytes:
            break
        text = read(corpus, rel)
        if len(text.splitlines()) <= HEAD_LINES:
            continue
        if len(text) > file_bytes:
            text = text[:text.find("\n", file_bytes) + 1 or len(text)]
        out.append(as_chat(rel, text))
        used += len(text)
    return out


def write_prompts(corpus: Corpus, split: str, path: Path, n: int, answer_chars: int = 400) -> int:
    """n held-out conversations of `split` ('a' or 'b') as JSONL {"messages": [...]}: the
    user turn is the prompt, the assistant turn the reference continuation."""
    if split not in ("a", "b"):
        raise ConfigError(f"split={split!r}: prompts come from the held-out sets 'a' or 'b'")
    rows = []
    for rel in corpus.files[split]:
        text = read(corpus, rel)
        if len(text.splitlines()) > HEAD_LINES + 4:
            rows.append(json.dumps({"messages": as_chat(rel, text, answer_chars=answer_chars), "source": rel}))
        if len(rows) == n:
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return len(rows)
