"""``LLM``: the embedded engine's offline API (vLLM's shape: ``LLM(...).generate(prompts, params)``)."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from collections.abc import Sequence
from typing import Any, cast

import torch

from spec_backend.backends import load_backend
from spec_backend.backends.base import Backend, BackendError, ModelOptions
from spec_backend.config import RejectionSamplerConfig, SpeculativeConfig, VerifyPlan
from spec_backend.engine.args import (
    check_args,
    check_parallel_args,
    check_quantization,
    eos_token_ids,
    refuse_unsupported,
    resolve_max_model_len,
)
from spec_backend.engine.assembly import (
    assemble,
    capture_steps,
    check_embedded_method,
    draft_loader,
    draft_preparation,
    step_policies,
)
from spec_backend.engine.core import EngineCore, seed_for
from spec_backend.engine.cost_profile import profile_engine
from spec_backend.engine.inputs import check_token_ids, params_per_prompt, parse_prompts
from spec_backend.engine.params import RequestOutput, SamplingParams
from spec_backend.engine.prefix import PrefixHits, PrefixSettings
from spec_backend.engine.request import Request, merge_samples
from spec_backend.engine.spec_config import parse_speculative_config
from spec_backend.engine.structured import make_grammars
from spec_backend.engine.tree_step import tree_plan
from spec_backend.engine.verify import Verifier
from spec_backend.metrics import (
    CounterMetric,
    SpecDecodingMetrics,
    VectorMetric,
    configure_default_logging,
    vllm_metrics,
)
from spec_backend.proposers.contract import DrafterContext
from spec_backend.runtime.loader import (
    ModelLoadError,
    load_model,
    load_tokenizer,
    register_attention,
    resolve_dtype,
)
from spec_backend.runtime.sources import ModelSource, resolve_model

logger = logging.getLogger("spec_backend.engine")

PromptInput = str | Sequence[int] | dict[str, Any]


def _available_backend(backend: str | Backend | None, quantization: str | None) -> Backend:
    """The backend named (or found), with ``quantization`` checked against it; ``BackendError`` before any
    weights load when it cannot run here (a missing device is not a model error)."""
    found = backend if isinstance(backend, Backend) else load_backend(backend)
    check_quantization(quantization, found.name, found.supported_quantizations)
    status = found.probe()
    if not status.available:
        raise BackendError(
            f"backend {found.name!r} cannot run on this machine: {status.reason} "
            f"(installed backends and their status: spec-backend backends)"
        )
    return found


class LLM:
    """A Hugging Face causal LM with speculative decoding and continuous batching.

    ``model``: a local folder (``config.json`` + weights), a ``.gguf`` file, or ``"smollm2"`` (the bundled
    SmolLM2-135M-Instruct GGUF). ``speculative_config``: vLLM's fields (``method``,
    ``num_speculative_tokens``, ``prompt_lookup_max``/``min``, ``disable_by_batch_size``,
    ``rejection_sample_method``, ...); ``None`` decodes without speculation. ``additional_config``:
    ``{"rejection_sampler_config": {...}}`` (dict or JSON). ``backend``: a backend name or object
    (default: ``load_backend()``). ``max_model_len``: most tokens (prompt + output) per request
    (default: the model's ``max_position_embeddings``, capped at 4096). ``max_num_seqs``: most requests
    decoded together. ``dtype``: ``"auto"`` (float32 on CPU), a name or a ``torch.dtype``. ``seed``:
    seeds requests that have no ``SamplingParams.seed``; the default 0 makes runs reproducible, as in
    vLLM (whose ``ModelConfig.seed`` defaults to 0); ``None`` draws fresh seeds each run.
    ``metrics_registry``: a ``prometheus_client`` registry for the acceptance counters.
    ``log_stats_interval``: seconds between acceptance log lines (``None``: off).
    ``enforce_eager``: never capture graphs (backends that capture replay the decode forward otherwise:
    the verify step at K+1 tokens per request, or plain decoding's one-token step). ``async_scheduling``:
    plain steps launched before the host takes in the step before them (``engine/lookahead.py``; default:
    on where the device queues launched work, ``Backend.launches_async``: CUDA, Ascend).
    ``kv_cache_memory_bytes``: KV cache budget for the target's and the drafter's caches together
    (default: ``max_num_seqs`` full-length requests); fewer slots are preallocated when it holds fewer.
    ``kv_transfer_config``: vLLM's connector config, for ``extract_hidden_states``
    (``ExampleHiddenStatesConnector``) only. ``enable_prefix_caching`` (default on, as in vLLM),
    ``block_size`` (positions per cached block, 16) and ``prefix_cache_memory_bytes`` (default: 4
    full-length requests' KV, at most ``kv_cache_memory_bytes``): automatic prefix caching
    (``engine/prefix.py``).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        speculative_config: dict[str, Any] | SpeculativeConfig | str | None = None,
        additional_config: dict[str, Any] | str | None = None,
        backend: str | Backend | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int = 16,
        dtype: str | torch.dtype = "auto",
        seed: int | None = 0,
        metrics_registry: Any | None = None,
        log_stats_interval: float | None = 10.0,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        kv_cache_memory_bytes: int | None = None,
        kv_transfer_config: dict[str, Any] | None = None,
        distributed_executor_backend: str | None = None,
        async_scheduling: bool | None = None,
        quantization: str | None = None,
        enable_prefix_caching: bool | None = None,
        block_size: int | None = None,
        prefix_cache_memory_bytes: int | None = None,
        **unsupported: Any,
    ) -> None:
        refuse_unsupported("LLM", unsupported)
        check_parallel_args(tensor_parallel_size, distributed_executor_backend, async_scheduling)
        prefix = PrefixSettings.parse(enable_prefix_caching, block_size, prefix_cache_memory_bytes)
        check_args(
            enforce_eager, seed, max_num_seqs, max_model_len, kv_cache_memory_bytes, kv_transfer_config
        )
        self.enforce_eager = enforce_eager
        self.backend = _available_backend(backend, quantization)
        self.async_scheduling = self.backend.launches_async if async_scheduling is None else async_scheduling
        try:  # the checkpoints' config.json complete the speculative config (spec_config)
            source: ModelSource | None = resolve_model(model)
        except ModelLoadError:
            source = None  # configuration errors are reported before the model's
        self.speculative_config = parse_speculative_config(speculative_config, source)
        verifier = self._verifier(additional_config, kv_transfer_config)
        self.source = source if source is not None else resolve_model(model)
        attn_name = register_attention(self.backend)
        runs_in = resolve_dtype(dtype) or self.backend.default_dtype
        device, recurrence = self.backend.device(), self.backend.recurrence_ops()
        self.model = load_model(self.source, attn_name, runs_in, device, recurrence)
        k = getattr(self.speculative_config, "num_speculative_tokens", None)  # the verify steps' K+1 rows
        self.backend.prepare_model(self.model, ModelOptions(quantization, k, self.source.gguf_path))
        self.tokenizer = load_tokenizer(self.source)
        self.max_model_len = resolve_max_model_len(self.model, max_model_len)
        self.eos_token_ids = eos_token_ids(self.model, self.tokenizer)
        self.metrics = SpecDecodingMetrics(registry=metrics_registry, log_interval_s=log_stats_interval)
        configure_default_logging()
        self._rng = random.Random(seed)
        self._next_id = 0
        self._lock = threading.Lock()  # generate() calls run one at a time
        self._owner: int | None = None  # thread inside generate(), to refuse re-entrant calls
        kv_args = (kv_cache_memory_bytes, kv_transfer_config)
        self.engine = self._engine(attn_name, verifier, max_num_seqs, *kv_args, prefix)

    def _verifier(
        self, additional_config: dict[str, Any] | str | None, kv_transfer_config: dict[str, Any] | None
    ) -> Verifier:
        """Bind the speculative config to the backend and build the verifier it asks for."""
        rs_config = RejectionSamplerConfig.from_additional_config(additional_config)
        spec = self.speculative_config
        if spec is None:
            if kv_transfer_config is not None:
                raise ValueError(
                    "kv_transfer_config needs speculative_config={'method': 'extract_hidden_states', ...}"
                )
        else:
            spec.bind(self.backend)
            check_embedded_method(spec, kv_transfer_config)
        return Verifier(self.backend, VerifyPlan.resolve(spec, rs_config))  # the rule and its parameters

    def _engine(
        self,
        attn_name: str,
        verifier: Verifier,
        max_num_seqs: int,
        kv_cache_memory_bytes: int | None,
        kv_transfer_config: dict[str, Any] | None,
        prefix: PrefixSettings,
    ) -> EngineCore:
        """The drafter, the preallocated caches and slot table, the engine, and its captured graphs."""
        spec = self.speculative_config
        ctx, k, disable, tree = None, 0, None, None
        if spec is not None:
            ctx = self._drafter_context(spec, attn_name, max_num_seqs, kv_transfer_config)
            k, disable = int(spec.num_speculative_tokens or 0), spec.disable_by_batch_size
            tree = tree_plan(spec)
            if tree is not None and not self.backend.token_trees:
                raise ValueError(f"backend {self.backend.name!r} cannot verify {tree.describe}")
        headroom = max(k, tree.max_nodes) if tree is not None else k  # a tree step writes every node
        runner, slots, drafter = assemble(
            self.model, ctx, self.max_model_len, max_num_seqs, kv_cache_memory_bytes, headroom,
            not prefix.enabled and tree is None,
        )  # fmt: skip
        recurrent, rule = bool(runner.cache.layout.states), verifier.plan.rule.name
        adaptive, confidence = step_policies(spec, k, drafter, tree, recurrent, rule)
        hits = PrefixHits.build(
            prefix.for_model(self.source.display, recurrent),
            [runner.cache, *(drafter.prefix_caches() if drafter else ())],
            bool(drafter is not None and drafter.hidden_states.any),
            self.metrics.registry,
            kv_cache_memory_bytes,
        )
        engine = EngineCore(
            runner, slots, verifier, drafter, k, max_num_seqs, disable, self.metrics, self.tokenizer,
            adaptive, hits, confidence, tree, self.async_scheduling,
        )  # fmt: skip
        engine.host_copy = self.backend.start_host_copy if self.backend.reads_early else None
        eager = self.enforce_eager or bool(spec is not None and spec.enforce_eager)
        eager |= tree is not None and not self.backend.captures_token_trees
        capture_steps(engine, self.backend, eager)
        if engine.adaptive is not None:  # drafting's cost before any step verifies drafts (cost_profile.py)
            engine.adaptive.profile = profile_engine(engine)
        return engine

    def _drafter_context(
        self, spec: SpeculativeConfig, attn_name: str, max_num_seqs: int, kv_transfer: dict[str, Any] | None
    ) -> DrafterContext:
        device, prepare = self.backend.device(), draft_preparation(self.backend, spec.quantization)
        return DrafterContext(
            spec,
            device,
            self.model,
            max_num_seqs,
            self.max_model_len,
            draft_loader(attn_name, self.model.dtype, device, prepare),
            kv_transfer,
            dict(self.tokenizer.get_vocab()) if self.tokenizer is not None else None,
            self.backend,
            self.enforce_eager or bool(spec.enforce_eager),
            self.source.directory if self.source.gguf_file is None else None,
            prepare,
        )

    # -- input handling ------------------------------------------------------------------------------
    def _tokenize(self, text: str | None, ids: list[int] | None, index: int) -> list[int]:
        if ids is not None:
            return ids
        assert text is not None
        if self.tokenizer is None:
            raise ValueError(
                f"prompt {index} is text but model {self.source.display} has no tokenizer; pass token ids"
            )
        tokens = [int(t) for t in self.tokenizer(text, add_special_tokens=True)["input_ids"]]
        if not tokens:
            raise ValueError(f"prompt {index} is empty (no tokens)")
        return tokens

    def make_requests(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[Request]:
        """Validated requests with fresh ids and seeds (``ValueError`` for bad input); not yet queued.
        A prompt with ``n`` samples gives ``n`` consecutive requests (``merge_samples`` joins their outputs).
        Not thread-safe: ids and seeds come from the engine's generator (the server calls it under a lock)."""
        parsed = parse_prompts(prompts)
        vocab = self.engine.runner.vocab_size
        no_tokenizer = self.source.display if self.tokenizer is None else None
        params_list = params_per_prompt(sampling_params, len(parsed), vocab, no_tokenizer)
        requests = []
        for i, ((text, ids, salt), params) in enumerate(zip(parsed, params_list, strict=True)):
            tokens = self._tokenize(text, ids, i)
            check_token_ids(tokens, i, vocab, self.max_model_len)
            requests.append(Request("", text, tokens, params, 0, self.eos_token_ids, cache_salt=salt))
        samples: list[Request] = []
        for request in requests:  # ids and seeds only once every prompt is known to be valid
            parent, self._next_id = str(self._next_id), self._next_id + 1
            samples += request.samples(parent, lambda: seed_for(self._rng))
        grammars = make_grammars(
            [r.params.structured_outputs for r in samples], self.eos_token_ids, self.tokenizer, vocab
        )
        for sample, grammar in zip(samples, grammars, strict=True):
            sample.grammar = grammar
        return samples

    # -- generation ----------------------------------------------------------------------------------
    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        **unsupported: Any,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        All inputs are validated before any work (``ValueError``). A request that fails while being
        processed ends with ``finish_reason="error"`` and its message in ``outputs[0].error``. Safe to call
        from several threads: calls run one after another (each one's outputs are what it would get
        alone). An exception escaping a step (``KeyboardInterrupt`` included) ends that call's requests
        and leaves the engine empty and ready for the next call.
        """
        refuse_unsupported("LLM.generate", unsupported)  # lora_request, priority, ...: named, not a TypeError
        if self._owner == threading.get_ident():
            raise RuntimeError("LLM.generate was called again from inside a running generate() on one thread")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                return self._generate(prompts, sampling_params, use_tqdm)
            finally:
                self._owner = None

    def _generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        self.engine.ensure_idle()
        requests = self.make_requests(prompts, sampling_params)
        bar = None
        try:
            for request in requests:
                self.engine.add(request)
            if use_tqdm:
                from tqdm import tqdm

                bar = tqdm(total=sum(r.params.max_tokens for r in requests), desc="Generating", unit="tok")
            while self.engine.has_unfinished():
                self.engine.step()
                if bar is not None:  # tokens so far; the total is the most the requests may generate
                    bar.update(sum(len(r.output_token_ids) for r in requests) - bar.n)
        except BaseException as exc:
            self.engine.abort_all(f"engine failed: {type(exc).__name__}: {exc}")
            if not isinstance(exc, Exception):
                raise
            logger.exception("engine step failed; every unfinished request ends with finish_reason='error'")
        finally:
            if bar is not None:
                bar.total = bar.n  # requests that stopped early: the bar ends full
                bar.close()
        self.metrics.maybe_log()
        return merge_samples(requests, self.tokenizer)

    def set_speculation(self, enabled: bool) -> None:
        """Turn speculation on or off for later ``generate`` calls (benchmarks compare both on one model)."""
        if enabled and self.engine.drafter is None:
            raise ValueError("this LLM was built without a speculative_config: nothing to enable")
        k = self.speculative_config.num_speculative_tokens if self.speculative_config else 0
        self.engine.k = int(k or 0) if enabled else 0

    def chat(
        self,
        messages: Sequence[dict[str, str]] | Sequence[Sequence[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        **unsupported: Any,
    ) -> list[RequestOutput]:
        """vLLM's ``LLM.chat``: one conversation (``[{"role": ..., "content": ...}, ...]``) or a list of
        them, each through ``chat_text``; then ``generate``."""
        refuse_unsupported("LLM.chat", unsupported)  # chat_template, tools, ...: named, not a TypeError
        one = len(messages) > 0 and isinstance(messages[0], dict)
        conversations = cast("list[Sequence[dict[str, str]]]", [messages] if one else list(messages))
        return self.generate([self.chat_text(c) for c in conversations], sampling_params, use_tqdm)

    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def chat_text(self, conversation: Sequence[dict[str, str]]) -> str:
        """``conversation`` through the tokenizer's chat template, with the generation prompt added;
        ``ValueError`` when the model has no chat template."""
        tokenizer = self.tokenizer
        if tokenizer is None or not self.has_chat_template():
            raise ValueError(f"model {self.source.display} has no chat template; use generate() with text")
        return str(
            tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True)
        )

    def get_metrics(self) -> list[CounterMetric | VectorMetric]:
        """vLLM's ``LLM.get_metrics()`` for speculative decoding: the lifetime counters under vLLM's names."""
        return vllm_metrics(self.metrics.total)

    def chat_prompt(self, message: str) -> str:
        """``message`` as one user turn through the chat template (for instruct models such as SmolLM2);
        unchanged when the model has none."""
        return self.chat_text([{"role": "user", "content": message}]) if self.has_chat_template() else message

    def describe(self) -> dict[str, Any]:
        """Model, backend and speculation settings (for logs and benchmark reports)."""
        spec = self.speculative_config
        return {
            "model": self.source.display,
            "backend": self.backend.name,
            "dtype": str(self.model.dtype),
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.engine.max_num_seqs,
            "prefix_caching": self.engine.prefix is not None,
            "speculative_config": json.loads(spec.model_dump_json(exclude_none=True)) if spec else None,
        }
