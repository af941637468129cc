# advtransfer — every target sets up the virtual environment first (nothing else to install).
#   make grid ATTACK=mifgsm [GRID=cifar10|grids/x.yaml]   train the zoo if needed, run the grid, plot
#                                     (without ATTACK: every attack the grid file lists)
#   make test                                             the whole test suite (what CI runs)
#   make zoo [SIZE=cpu|converged|ci|full]   make plot RUN=results/cifar10   make bench
#   make distortion RUN=results/cifar10                   distortion analyses of a finished run, then its report
#   make golden-update    refresh the ci grid's regression baseline results/baselines/ci/
#   make fingerprints     refresh the attacks' output fingerprints after a version bump
#   make claims-runs SIZE=cpu|converged [GRIDS="attack-families input-transforms@eps16 ..."]   run what the claims need
#   make claims-pack SIZE=...   pack the unfinished claims runs without their examples into claims/partial/ (commit:
#                 the next make claims-runs, on any clone, resumes them)
#   DEADLINE=2026-12-08T00:40 (or 90m) on grid and claims-runs: start no cell that would end after it (a clock
#                 time holds for every grid of claims-runs, a duration for each); a run stopped early exits 75
#   make claims   keep their per-image records in claims/records/ and tabulate them (into docs/claims.md)
#   make docs     the documentation site (docs/, mkdocs.yml) built with mkdocs --strict into site/
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ATTACK ?=
GRID   ?= cifar10
RUN    ?= results/$(GRID)
SIZE   ?= cpu
# the torch/torchvision pair the test suite runs on (pyproject.toml allows compatible ranges)
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

# The offline CIFAR-10 copy beside the checkout, when present (users with internet may omit it:
# the harness then downloads CIFAR-10 with torchvision into its cache).
ifneq ($(wildcard ../shared/data/cifar10/test.npz),)
export ADVTRANSFER_DATA ?= $(abspath ../shared/data/cifar10)
endif

STAMP := $(VENV)/.installed

# The tests, their golden baseline and the attack fingerprints run on AVX2 kernels on every x86-64
# machine (AVX-512 machines give other float32 bits; tests/conftest.py says what was measured).
ifneq ($(filter x86_64 amd64 AMD64,$(shell uname -m)),)
KERNELS := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
endif

.PHONY: install grid test zoo plot bench distortion report clean-results golden-update fingerprints claims claims-runs claims-pack docs

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# pyproject.toml declares compatible torch/torchvision ranges; install the tested pair here
	$(BIN)/python -m pip install -q -e '.[test]' $(TORCH_PINS)
	@# torchattacks pins requests~=2.25.1 but imports neither requests nor torchvision: install it
	@# without its dependencies (it needs scipy, a core dependency) so the install keeps current requests.
	$(BIN)/python -m pip install -q --no-deps torchattacks==3.5.1
	@touch $@

grid: $(STAMP)
	$(BIN)/advtransfer grid $(GRID) $(if $(ATTACK),--attack $(ATTACK)) $(if $(DEADLINE),--deadline '$(DEADLINE)')

zoo: $(STAMP)
	$(BIN)/advtransfer zoo train --size $(SIZE)

plot: $(STAMP)
	$(BIN)/advtransfer plot $(RUN)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_train.py
	$(BIN)/python benchmarks/bench_defences.py
	$(BIN)/python benchmarks/bench_attack.py
	$(BIN)/python benchmarks/bench_store.py
	$(BIN)/python benchmarks/bench_blackbox.py
	$(BIN)/python benchmarks/bench_executors.py
	$(BIN)/python benchmarks/bench_contention.py

# minimal distortion, HopSkipJump yardstick, union over attacks, FiT, SAT; then the report
distortion: $(STAMP)
	$(BIN)/advtransfer distortion $(RUN)
	$(BIN)/advtransfer report $(RUN)

report: $(STAMP)
	$(BIN)/advtransfer report $(RUN)

# Two pytest-xdist workers, one test file each at a time (module and session fixtures are built once
# per file; ci models and the ci grid run once per test run, tests/conftest.py), one torch thread each:
# measured on 2 cores (2026-12-07): the whole suite in 1028 s, against 1201-1316 s for one process on
# two threads (CPU use 193% against 177%). Files, not groups: xdist's --dist loadgroup cannot tag
# test ids under pytest 9 (measured: grouped tests still spread), so the ci grid run that test_cli and
# test_golden share is made once under a file lock instead.
TEST_WORKERS ?= 2
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(KERNELS) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests

# The ci grid's golden counts, made by the check's own code path (tests/test_golden.py) at CI's
# settings (OMP_NUM_THREADS unset; the test pins 2 torch threads), with the ci models they were
# made with and their kernel probe; commit results/baselines/ci/ (zoo/ included).
golden-update: $(STAMP)
	env -u OMP_NUM_THREADS ADVTRANSFER_GOLDEN_UPDATE=1 HF_HUB_OFFLINE=1 $(KERNELS) $(BIN)/python -m pytest tests/test_golden.py -q
	@echo "baseline refreshed: review 'git diff results/baselines/ci' and commit it"

# Every attack's output fingerprint (tests/attack_fingerprints.json), on the suite's pinned kernels;
# run after bumping an attack's version.
fingerprints: $(STAMP)
	$(KERNELS) $(BIN)/python -m advtransfer.attacks.fingerprint --update tests/attack_fingerprints.json > /dev/null
	@echo "fingerprints refreshed: review 'git diff tests/attack_fingerprints.json' and commit it"

# The seeds' claims (claims/cifar10.yaml): run every grid they need at one zoo size (resumable),
# then keep the per-image records the claims use (claims/records/, committed) and tabulate every
# size from them into results/claims/ and the generated table of docs/claims.md.
CLAIMS      ?= claims/cifar10.yaml
CLAIMS_RUNS ?= results/claims
GRIDS       ?=
CLAIMS_N    ?= 1000
# A run too long for one machine goes on in sittings: stop make claims-runs (Ctrl-C or kill), then
# make claims-pack SIZE=... packs each unfinished run under CLAIMS_RUNS/SIZE without its adversarial
# examples into PARTIAL/SIZE/<run>/ (advtransfer pack: rows, per-image tables and the manifest;
# commit it), and the next make claims-runs on any clone copies that pack into the run
# folder when the folder does not exist and crafts only the cells not yet finished. claims-pack
# removes the pack of a run that has finished (make claims keeps its records).
PARTIAL     ?= claims/partial
claims-runs: $(STAMP)
	@runs="$$($(BIN)/advtransfer claims $(CLAIMS) --list-grids --size $(SIZE))" || exit 2; failed=""; \
	list="$$(mktemp)"; printf '%s\n' "$$runs" > "$$list"; \
	while IFS="$$(printf '\t')" read -r name args; do \
	  if [ -n "$(GRIDS)" ]; then case " $(GRIDS) " in *" $$name "*) ;; *) continue ;; esac; fi; \
	  if [ ! -e "$(CLAIMS_RUNS)/$(SIZE)/$$name" ] && [ -f "$(PARTIAL)/$(SIZE)/$$name/manifest.json" ]; then \
	    mkdir -p "$(CLAIMS_RUNS)/$(SIZE)" && cp -R "$(PARTIAL)/$(SIZE)/$$name" "$(CLAIMS_RUNS)/$(SIZE)/$$name" || exit 1; \
	    echo "$$name: resuming from the pack $(PARTIAL)/$(SIZE)/$$name"; fi; \
	  eval "$(BIN)/advtransfer grid -n $(CLAIMS_N) $$args --size $(SIZE) --out $(CLAIMS_RUNS)/$(SIZE)/$$name --no-plot $(if $(DEADLINE),--deadline '$(DEADLINE)')" \
	    </dev/null || failed="$$failed $$name"; \
	done < "$$list"; rm -f "$$list"; \
	test -z "$$failed" || { echo "runs that did not finish at size $(SIZE):$$failed"; exit 1; }

claims-pack: $(STAMP)
	@for run in $(CLAIMS_RUNS)/$(SIZE)/*/; do run="$${run%/}"; name="$${run##*/}"; \
	  test -f "$$run/manifest.json" || continue; \
	  if $(BIN)/python -c "import json, sys; sys.exit(1 if json.load(open(sys.argv[1])).get('finished_at') else 0)" "$$run/manifest.json"; then \
	    $(BIN)/advtransfer pack "$$run" "$(PARTIAL)/$(SIZE)/$$name" || exit $$?; \
	  elif [ -d "$(PARTIAL)/$(SIZE)/$$name" ]; then rm -rf "$(PARTIAL)/$(SIZE)/$$name"; \
	    echo "removed the pack $(PARTIAL)/$(SIZE)/$$name: $$run has finished (make claims keeps its records)"; fi; \
	done

claims: $(STAMP)
	$(BIN)/advtransfer claims $(CLAIMS) --runs $(CLAIMS_RUNS) --records claims/records --page docs/claims.md

# The documentation site: docs/ with mkdocs.yml, built by mkdocs-material in strict mode (a broken
# link or a page missing from the nav fails the build) into site/ (not committed). Its packages are
# pyproject.toml's `docs` extra, installed into the venv on first use without reinstalling the
# package; the reference pages (docs/reference/) are generated from the installed package's code by
# scripts/gen_reference.py and the results pages (docs/results/) from claims/records by
# scripts/gen_results.py first (neither is committed).
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['docs']))" \
	  | xargs $(BIN)/python -m pip install -q
	@touch $@

docs: $(STAMP) $(DOCS_STAMP)
	$(BIN)/python scripts/gen_reference.py docs/reference
	$(BIN)/python scripts/gen_results.py docs/results
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean-results:  # every run folder; the committed baselines stay
	find results -mindepth 1 -maxdepth 1 -type d ! -name baselines -exec rm -rf {} +
