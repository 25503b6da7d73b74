"""Offline training text: Python sources and docs of installed packages, as chat conversations.

No download is needed: the text is the ``.py``, ``.md`` and ``.rst`` files of packages already installed
(``DEFAULT_PACKAGES`` plus the standard library). Each file goes wholly to the training or the held-out
split, chosen by a hash of its path relative to its package (the same on every machine), so held-out
prompts never share a file with training data. A file is cut into chunks; each chunk becomes a chat
whose user turn asks about its first part and whose assistant turn is the rest, rendered with the
target's chat template when it has one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_PACKAGES = (
    "json",
    "email",
    "http",
    "asyncio",
    "transformers",
    "pydantic",
    "safetensors",
    "tokenizers",
)
SUFFIXES = (".py", ".md", ".rst")


@dataclass(frozen=True)
class Document:
    """One source file: its stable name (``package/relative/path``) and text."""

    name: str
    text: str

    @property
    def held_out(self) -> bool:
        """One file in ten, by a hash of its name."""
        return int(hashlib.sha256(self.name.encode()).hexdigest(), 16) % 10 == 0


def documents(packages: Sequence[str] = DEFAULT_PACKAGES, max_bytes: int = 200_000) -> Iterator[Document]:
    """The text files of ``packages`` that are installed, in a stable order (missing packages are skipped)."""
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = next(iter(spec.submodule_search_locations))
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for file in sorted(files):
                path = os.path.join(folder, file)
                if not file.endswith(SUFFIXES) or os.path.getsize(path) > max_bytes:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                if text.strip():
                    yield Document(f"{package}/{os.path.relpath(path, root)}", text)


def conversations(doc: Document, chunk_chars: int = 1600) -> Iterator[list[dict[str, str]]]:
    """Chats cut from one document: the user shows a chunk's first third, the assistant continues it."""
    for start in range(0, len(doc.text), chunk_chars):
        chunk = doc.text[start : start + chunk_chars]
        if len(chunk) < 200:
            continue
        cut = len(chunk) // 3
        user = f"Continue this excerpt of {doc.name}:\n\n{chunk[:cut]}"
        yield [{"role": "user", "content": user}, {"role": "assistant", "content": chunk[cut:]}]


def encode(tokenizer: Any, chat: list[dict[str, str]], max_len: int) -> list[int]:
    """A chat as token ids (the chat template when the tokenizer has one), cut to ``max_len``."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(chat, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 returns a BatchEncoding
    else:
        ids = tokenizer.encode("\n".join(m["content"] for m in chat))
    return [int(i) for i in ids][:max_len]


def split_corpus(
    tokenizer: Any,
    num_train: int,
    num_held_out: int,
    max_len: int,
    packages: Sequence[str] = DEFAULT_PACKAGES,
) -> tuple[list[list[int]], list[list[int]]]:
    """Up to ``num_train`` training and ``num_held_out`` held-out sequences (token ids), split by file."""
    train: list[list[int]] = []
    held: list[list[int]] = []
    for doc in documents(packages):
        bucket, want = (held, num_held_out) if doc.held_out else (train, num_train)
        for chat in conversations(doc):
            if len(bucket) < want:
                bucket.append(encode(tokenizer, chat, max_len))
        if len(train) >= num_train and len(held) >= num_held_out:
            break
    return train, held


__all__ = ["DEFAULT_PACKAGES", "Document", "conversations", "documents", "encode", "split_corpus"]
