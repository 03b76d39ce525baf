# The two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU build of torch; override on a GPU machine, e.g. `make test TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
BASE_STAMP := $(VENV)/.installed-base
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo demo-recall test test-isa test-gpu-interp test-slow lint format bench gpu-check studies clean

# the package and what it needs (the demos); the test extra on top for the tests and the lint
$(BASE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install -q --disable-pip-version-check -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(BASE_STAMP)
	$(BIN)/swax demo

# the paper's window effect on recall: a short- and a long-window model, about 4 minutes
demo-recall: $(BASE_STAMP)
	$(BIN)/swax demo recall

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not gpu" $(PYTEST_ARGS)

# The op tests again under other CPU instruction sets than the machine's own: float32 rounding
# differs between ATen's kernels, and the tolerances must hold on all of them.
OP_TESTS := tests/ops/test_mlstm_op.py tests/ops/test_gated_delta_op.py tests/ops/test_attention_op.py \
	tests/ops/test_backends.py tests/ops/test_doc_mask.py tests/ops/test_bf16_kernels.py
test-isa: $(STAMP)
	for isa in default avx2; do \
		echo "op tests with ATEN_CPU_CAPABILITY=$$isa"; \
		ATEN_CPU_CAPABILITY=$$isa $(BIN)/python -m pytest -q -n 2 $(OP_TESTS) \
			$(PYTEST_ARGS) || exit 1; \
	done

# The gpu tier on the CPU: Triton's interpreter runs mlstm_kernels' and fla's kernels for real
# (slowly) against the float64 references. A venv of its own, so that Triton and fla never
# reach the other tiers; the interpreter is on for this stage alone (elsewhere it would make the
# normal tests pick the interpreted kernels). TRITON_SPEC: what torch 2.13's CUDA wheels pin.
INTERP_VENV  ?= .venv-interp
INTERP_STAMP := $(INTERP_VENV)/.installed
TRITON_SPEC  ?= triton==3.7.1
GPU_TESTS    := tests/gpu/test_gpu.py tests/ops/test_doc_mask.py
$(INTERP_STAMP): pyproject.toml
	$(PYTHON) -m venv $(INTERP_VENV)
	$(INTERP_VENV)/bin/pip install -q --disable-pip-version-check "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	$(INTERP_VENV)/bin/pip install -q --disable-pip-version-check -e '.[interp]'
	touch $(INTERP_STAMP)

test-gpu-interp: $(INTERP_STAMP)
	TRITON_INTERPRET=1 $(INTERP_VENV)/bin/python -m pytest -q -n 2 -m gpu $(GPU_TESTS) \
		$(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m "slow" $(PYTEST_ARGS)

LINT_PATHS := swax tests benchmarks experiments tools
# ruff, then the import structure: no circles, ops < layers < model, data apart (tools/check_imports.py),
# then the sizes of all code: files <= 500 lines (tests 850), functions <= 85, fmt: skip on tables only
# (tools/check_sizes.py)
lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/python tools/check_imports.py
	$(BIN)/python tools/check_sizes.py

format: $(STAMP)
	$(BIN)/ruff check --fix $(LINT_PATHS)
	$(BIN)/ruff format $(LINT_PATHS)

bench: $(STAMP)
	$(BIN)/python benchmarks/ops.py
	$(BIN)/python benchmarks/train_speed.py
	$(BIN)/python benchmarks/decode.py
	$(BIN)/python benchmarks/decode.py --compare --threads 1 --steps 128 --repeats 9
	$(BIN)/python benchmarks/prefill.py

# On a CUDA machine, with that machine's own torch (no venv, no network needed): the gpu test
# tier, mlstm_kernels' gradients, op timings, training and decode speed, in at most 8 minutes
# -> benchmarks/results/gpu_check.{json,md}. `python3 tools/gpu_check.py --dry-run` lists it.
gpu-check:
	$(PYTHON) tools/gpu_check.py

# Every study's reports regenerated from its committed results and compared with the committed
# ones byte for byte (`python -m experiments.<study> report --check`, docs/studies.md); a study is
# a folder of experiments/ with a __main__.py. About a minute on 2 cores.
studies: $(BASE_STAMP)
	@fail=0; for main in experiments/*/__main__.py; do \
		study=$$(basename $$(dirname $$main)); \
		$(BIN)/python -m experiments.$$study report --check || fail=1; \
	done; exit $$fail

clean:
	rm -rf $(VENV) $(INTERP_VENV) .pytest_cache build *.egg-info
