"""Incremental detokenization for streams: the deltas join to exactly the whole decode, and each step
decodes a bounded window, however long the output (a byte-level BPE tokenizer trained here, so
multi-byte characters span several tokens and words carry their leading spaces)."""

from __future__ import annotations

from typing import Any

import pytest

from spec_backend.server.detokenize import IncrementalDetokenizer

TEXT = "héllo wörld, ✓ done; 日本語のテキスト and   spaced  words 🎉 end."


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    raw.train_from_iterator([TEXT, "hello world done words", "spaced end"] * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")


class CountingTokenizer:
    """Records how many tokens each decode call reads."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.lengths = inner, []

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        self.lengths.append(len(tokens))
        return str(self.inner.decode(tokens, skip_special_tokens=skip_special_tokens))


def test_deltas_join_to_the_whole_decode(tokenizer: Any) -> None:
    ids = tokenizer(TEXT * 3)["input_ids"]
    assert any("\ufffd" in tokenizer.decode(ids[:n]) for n in range(1, len(ids)))  # partial characters occur
    for chunk in (1, 2, 5):  # tokens per step (speculation emits several)
        stream = IncrementalDetokenizer(tokenizer)
        deltas = [stream.step(ids[:n]) for n in range(chunk, len(ids) + chunk, chunk)]
        assert "".join(deltas) == tokenizer.decode(ids) == TEXT * 3
        assert all("\ufffd" not in d for d in deltas)


def test_special_tokens_follow_skip_special_tokens(tokenizer: Any) -> None:
    ids = tokenizer("hello")["input_ids"] + [tokenizer.eos_token_id] + tokenizer(" world")["input_ids"]
    for skip in (True, False):
        stream = IncrementalDetokenizer(tokenizer, skip)
        joined = "".join(stream.step(ids[:n]) for n in range(1, len(ids) + 1))
        assert joined == tokenizer.decode(ids, skip_special_tokens=skip)
        assert ("<eos>" in joined) is not skip


def test_each_step_decodes_a_bounded_window(tokenizer: Any) -> None:
    ids = tokenizer(TEXT * 20)["input_ids"]
    counting = CountingTokenizer(tokenizer)
    stream = IncrementalDetokenizer(counting)
    for n in range(1, len(ids) + 1):
        stream.step(ids[:n])
    assert len(ids) > 300 and max(counting.lengths) <= 12  # not the whole output (quadratic work)
