# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both set everything up on a fresh machine. Anything that starts Ray runs in a private
# network namespace, so Ray binds nothing but loopback.

VENV   ?= .venv
PY     := $(VENV)/bin/python
NETNS  := unshare --net sh -c 'ip link set lo up && exec "$$0" "$$@"'
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 takes the local CPU wheel; a looser spec would pull GBs of CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(NETNS) $(VENV)/bin/envfarm demo

test: $(STAMP)
	$(NETNS) $(PY) -m pytest -q

bench: $(STAMP)
	$(NETNS) $(PY) benchmarks/bench_runtime.py

clean:
	rm -rf $(VENV) .pytest_cache
