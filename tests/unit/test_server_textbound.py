"""Text too long for ``max_model_len`` is refused before it is tokenized, and only when it cannot fit:
the characters-per-token bound holds on adversarial text for the pipelines it accepts (byte-level BPE,
SentencePiece-style BPE with byte fallback, NFC + byte-level as Qwen's), and pipelines that can fold
unbounded text into one token get no bound (the test model's own character tokenizer is one: fifty
newlines are one unknown token)."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the serve extra")

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from spec_backend.server.state import ApiError, Server
from spec_backend.server.textbound import chars_per_token_bound, too_long_for
from spec_backend.tools.tiny import make_tiny_tokenizer

CORPUS = [
    "hello world, the quick brown fox",
    "héllo wörld 日本語のテキスト 🎉 done",
    "aaaa bbbb    spaced",
] * 20


def byte_level(normalizer: Any = None) -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.BPE())
    raw.normalizer = normalizer
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, initial_alphabet=alphabet))
    return PreTrainedTokenizerFast(tokenizer_object=raw)


def byte_fallback(normalizer: Any = None) -> PreTrainedTokenizerFast:
    """SentencePiece-style (Llama 2, Gemma): spaces become ``▁``, unknown characters fall back to bytes."""
    raw = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    raw.normalizer = normalizer or normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    specials = ["<unk>", "<s>"] + [f"<0x{i:02X}>" for i in range(256)]
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>")


def adversarial_texts() -> list[str]:
    rng = random.Random(0)
    alphabet = [*"ab ,.\n\t", "é", "e\u0301", "日本", "🎉", "\u0000", "\ufffd", "ᄀ\u1161\u11a8", "<s>"]
    texts = [" " * 300, "\n" * 300, "\t \n" * 100, "e" + "\u0301" * 200, "a" * 500, "🎉" * 100]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400))) for _ in range(200)]
    return texts


@pytest.mark.parametrize(
    "make",
    [byte_level, byte_fallback, lambda: byte_level(normalizers.NFC())],
    ids=["byte-level BPE", "SentencePiece-style BPE", "NFC + byte-level BPE"],
)
def test_the_bound_holds_on_adversarial_text(make: Any) -> None:
    tokenizer = make()
    bound = chars_per_token_bound(tokenizer)
    assert bound is not None
    for text in adversarial_texts():
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        assert len(ids) * bound >= len(text), (text[:40], len(ids), bound)


def test_the_bound_is_the_longest_token_scaled_by_the_normalizer() -> None:
    tokenizer = byte_level()
    longest = max(len(t) for t in tokenizer.get_vocab())
    assert chars_per_token_bound(tokenizer) == longest
    assert chars_per_token_bound(byte_level(normalizers.NFC())) == 4 * longest  # NFC joins up to 4 into 1


def with_spec(tokenizer: PreTrainedTokenizerFast, change: Any) -> PreTrainedTokenizerFast:
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    change(spec)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))


def test_pipelines_that_can_fold_text_get_no_bound(tmp_path: Any) -> None:
    make_tiny_tokenizer(tmp_path)
    words = AutoTokenizer.from_pretrained(tmp_path)  # the test model's: word-level, unknown pieces
    assert len(words("\n" * 50)["input_ids"]) == 1  # why: 50 characters, 1 token
    assert chars_per_token_bound(words) is None
    assert chars_per_token_bound(AutoTokenizer.from_pretrained(tmp_path, use_fast=False)) is None

    def strip(spec: dict[str, Any]) -> None:
        spec["normalizer"] = {"type": "Strip", "strip_left": True, "strip_right": True}

    def whitespace_split(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"] = {"type": "WhitespaceSplit"}

    def swallowing_added_token(spec: dict[str, Any]) -> None:
        spec["added_tokens"][0]["lstrip"] = True

    def no_fallback(spec: dict[str, Any]) -> None:
        spec["model"]["byte_fallback"] = False  # unknown characters fused into one <unk>

    for change in (strip, whitespace_split, swallowing_added_token, no_fallback):
        assert chars_per_token_bound(with_spec(byte_fallback(), change)) is None, change.__name__
    folded = with_spec(byte_fallback(), no_fallback)
    assert len(folded("✓" * 40, add_special_tokens=False)["input_ids"]) <= 2  # why: one <unk> for 40


def test_too_long_for_refuses_exactly_what_cannot_fit() -> None:
    assert too_long_for("x" * (512 * 3 - 1), 512, 3) is None  # might be 511 tokens: it may fit
    why = too_long_for("x" * (512 * 3), 512, 3)
    assert why is not None and why.startswith("has 1536 characters, so at least 512 tokens")
    assert too_long_for("x" * 10**6, 512, None) is None  # no bound: tokenize and count


def test_the_server_refuses_before_tokenizing() -> None:
    """``Server.tokenize`` measures text first: a text that cannot fit never reaches the tokenizer;
    one that may fit is tokenized and checked."""
    tokenizer = byte_level()
    bound = chars_per_token_bound(tokenizer)
    assert bound is not None
    calls: list[str] = []

    def tokenize(text: str, ids: Any, index: int) -> list[int]:
        calls.append(text)
        return [int(t) for t in tokenizer(text)["input_ids"]]

    runner = SimpleNamespace(vocab_size=400)
    llm = SimpleNamespace(
        tokenizer=tokenizer, max_model_len=64, _tokenize=tokenize, engine=SimpleNamespace(runner=runner)
    )
    server = Server(SimpleNamespace(llm=llm), "tiny", None)  # type: ignore[arg-type]
    with pytest.raises(ApiError, match=r"prompt 1 has \d+ characters, so at least 64 tokens") as refused:
        asyncio.run(server.tokenize(["fits", "x" * (64 * bound)]))
    assert refused.value.status == 400 and calls == []
    assert asyncio.run(server.tokenize(["hello world"])) == [tokenizer("hello world")["input_ids"]]
    with pytest.raises(ApiError, match="prompt 0 has 100 tokens; max_model_len=64"):
        asyncio.run(server.tokenize(["\u0000" * 100]))  # under the character bound, over in tokens
