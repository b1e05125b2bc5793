# transformer-lite: every target works from a fresh clone.
# `make help` lists them.

PYTHON ?= python3
# Processes that run the chapters side by side (nbval); 0 runs them in
# one process, one after another.
WORKERS ?= 2
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.py))
IPYNB  := $(NOTEBOOKS:.py=.ipynb)

.DEFAULT_GOAL := help
.PHONY: help install test contracts unit nbval seed-sweep book \
  book-zh translations translations-update fonts pdf \
  browser-test lab lint bench bench-profile gpu-check clean assignments slides \
  student-kit student-lab \
  chapter-times

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

install: $(STAMP)  ## create .venv with the pinned requirements and the package

# Each phase is timed (tools/test_phases.py); the end, or a failing phase,
# prints the phases' seconds and the ten slowest unit tests and chapters.
PHASE := $(PYTHON) tools/test_phases.py run
test:  ## everything: contracts, unit tests, every notebook, the book, the slides
	@$(PYTHON) tools/test_phases.py start
	@$(PHASE) install -- $(MAKE) --no-print-directory install
	@$(PHASE) contracts -- $(MAKE) --no-print-directory contracts
	@$(PHASE) translations -- $(MAKE) --no-print-directory translations
	@$(PHASE) unit -- $(MAKE) --no-print-directory unit \
	  UNIT_REPORT=_build/unit-junit.xml
	@$(PHASE) nbval -- $(MAKE) --no-print-directory nbval
	@$(PHASE) book -- $(MAKE) --no-print-directory book
	@$(PHASE) book-zh -- $(MAKE) --no-print-directory book-zh BOOK_ZH_NEED=
	@$(PHASE) slides -- $(MAKE) --no-print-directory slides SLIDES_NEED=
	@$(PHASE) pdf -- $(MAKE) --no-print-directory pdf PDF_NEED=
	@$(PHASE) browser -- $(MAKE) --no-print-directory browser-test \
	  BROWSER_NEED=
	@$(PYTHON) tools/test_phases.py report

contracts: install  ## the package's tiers import one way (import-linter)
	$(BIN)/lint-imports

UNIT_REPORT ?=
# WORKERS at a time, one thread each, as the chapters run.
unit: install  ## the package's unit tests
	$(NBVAL_ENV) $(BIN)/python -m pytest tests \
	  -m "not browser and not classroom" -q \
	  $(if $(filter 0,$(WORKERS)),,-n $(WORKERS)) \
	  $(if $(UNIT_REPORT),--junitxml=$(UNIT_REPORT))

notebooks/%.ipynb: notebooks/%.py
	$(BIN)/jupytext --quiet --to ipynb $< -o $@

# nbval also hands each chapter it executed, outputs included, to the book's
# execution cache (tools/nbval_book_cache.py): `make book` right after it
# renders those outputs instead of running every chapter a second time.
# The chapters run WORKERS at a time (pytest-xdist), each whole in one
# worker and on one thread (OMP_NUM_THREADS=1): a chapter that asks for
# two threads while another chapter holds a core waits on its descheduled
# thread at every operation, and runs many times slower. nbgrader grades
# every chapter's assignment in the same run (tests/test_assignments.py),
# each chapter's grading a piece of work of its own. The longest pieces,
# by their last measured time, start first (tools/whole_chapters.py), so
# that the workers finish close together; the JUnit report measures them
# again, for that order and for the syllabus (make chapter-times).
NBVAL_ENV := $(if $(filter 0,$(WORKERS)),,OMP_NUM_THREADS=1)
nbval: install _build/.package-stamp $(IPYNB)  ## execute every chapter as a test (nbval)
	@if [ -z "$(IPYNB)" ]; then echo "no notebooks yet"; exit 0; fi; \
	$(NBVAL_ENV) PYTHONPATH=tools $(BIN)/python -m pytest -q \
	  -p no:cacheprovider -n $(WORKERS) \
	  --dist loadgroup --no-loadscope-reorder -p whole_chapters \
	  -p nbval_book_cache --book-cache _build/.jupyter_cache --nbval \
	  --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg \
	  --junitxml=_build/nbval-junit.xml \
	  --durations=0 tests/test_assignments.py $(IPYNB)

assignments: install  ## the graded exercises as nbgrader assignments (_build/classroom)
	$(BIN)/python tools/assignments.py

# What a class on laptops without a network is given: the student edition,
# the package as a wheel, the pins, and how to install them (README.txt).
student-kit: install  ## the student edition to hand out, offline (_build/student-kit)
	$(BIN)/python tools/assignments.py --kit _build/student-kit

student-lab: student-kit  ## JupyterLab on the student edition alone, as a student sees it
	$(BIN)/jupyter lab $(ALLOW_ROOT) _build/student-kit/assignments

chapter-times: install  ## the syllabus's running times, from the last make nbval
	$(BIN)/python tools/chapter_times.py

# Every chapter takes all of its seeds from BOOK_SEED (default 0, the book's).
# A trained model also depends on the kernels PyTorch picks for the CPU's
# instruction set and on the thread count: each is another rounding, which
# training turns into another model. The sweep runs the chapters that train,
# sample or measure under every seed x kernel setting at one thread, and every
# seed at the other thread counts on the native kernels (3 x 3 + 3 = 12 runs
# a chapter), SWEEP_WORKERS cores at a time, and records the value of every
# assert (tools/sweep_claims.py). The kernel settings (tools/seed_sweep.py):
#   native    what this CPU picks by itself
#   avx2      ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
#             ONEDNN_MAX_CPU_ISA=AVX2
#   baseline  ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2
#             ONEDNN_MAX_CPU_ISA=SSE41
#   avx512    (on a CPU with AVX-512) ATEN_CPU_CAPABILITY=avx512 ...
# A setting that is this CPU's own (avx2 on an AVX2 CPU) is the native one
# and is not run twice. SWEEP_RECORD=notebooks/sweeps keeps each chapter's
# table of claims (floor, worst value, spread) beside the chapters.
SWEEP_CHAPTERS ?= 06 07 08 09 10 11 12 13 14
SWEEP_SEEDS ?= 0 1 2
SWEEP_KERNELS ?= native avx2 baseline
SWEEP_THREADS ?= 1 2
SWEEP_WORKERS ?= 2
SWEEP_RECORD ?=
SWEEP_IPYNB = $(patsubst %.py,%.ipynb,$(foreach n,$(SWEEP_CHAPTERS),\
  $(wildcard notebooks/$(n)_*.py)))

seed-sweep: install $(SWEEP_IPYNB)  ## run the training chapters over seeds x CPU kernels x threads; every assert's spread
	$(BIN)/python tools/seed_sweep.py --seeds "$(SWEEP_SEEDS)" \
	  --kernels "$(SWEEP_KERNELS)" --threads "$(SWEEP_THREADS)" \
	  --workers $(SWEEP_WORKERS) \
	  $(if $(SWEEP_RECORD),--record $(SWEEP_RECORD)) $(SWEEP_IPYNB)

# The book caches each executed chapter (jupyter-cache), keyed by the
# chapter's own code. Its outputs also depend on the package: a change there
# clears the cache and the parsed pages, so every chapter runs again.
BOOK_INPUTS := $(shell find transformer_lite -type f -not -name '*.pyc') \
  requirements.txt

_build/.package-stamp: $(BOOK_INPUTS)
	rm -rf _build/.jupyter_cache _build/.doctrees
	mkdir -p _build && touch $@

book: install _build/.package-stamp  ## execute every chapter and build the HTML book (_build/html)
	$(BIN)/python tools/book_assets.py
	$(BIN)/jupyter-book build notebooks --path-output . -W --keep-going

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The Chinese edition: the same chapters, their prose from the catalogues
# in notebooks/locales/zh_CN (tools/i18n.py), their code and outputs the
# English build's (its execution cache: nothing runs again). It lands in
# _build/html/zh; every page links to the same page in the other edition.
# A CJK font (Debian's, as Chromium is) draws the Chinese in the browser's
# screenshots and the PDF.
CJK_FONT := /usr/share/fonts/truetype/wqy/wqy-microhei.ttc
fonts:  ## a CJK font for the Chinese edition's pages, screenshots and PDF (apt)
	test -f $(CJK_FONT) || { $(SUDO) apt-get update && \
	  $(SUDO) apt-get install -y fonts-wqy-microhei; }

BOOK_ZH_NEED ?= book
book-zh: install fonts $(BOOK_ZH_NEED)  ## the Chinese edition (_build/html/zh), from the English build's outputs
	$(BIN)/python tools/i18n.py build

translations: install  ## every catalogue's counts; fail on a broken or stale translation
	$(BIN)/python tools/i18n.py check

# After changing English prose: the changed messages turn fuzzy (their
# page shows the English until a translator confirms them), new ones are
# added empty. Translate them, then `make translations`.
translations-update: install  ## merge the book's current English messages into the catalogues
	$(BIN)/python tools/book_assets.py
	$(BIN)/python tools/i18n.py pot
	$(BIN)/python tools/i18n.py update

# make test builds the book once, as its own phase, and passes SLIDES_NEED=
# and BROWSER_NEED= so that the next phases do not build it again.
SLIDES_NEED ?= book book-zh
slides: $(SLIDES_NEED)  ## a reveal.js deck per chapter, in each edition, cut from the executed chapters
	$(BIN)/python tools/slides.py
	$(BIN)/python tools/slides.py --language zh_CN

# Each edition as one PDF (tools/pdf.py): a single-page build from the
# English build's execution cache, printed by Debian's Chromium with a
# linked table of contents and an outline of the pages and their sections.
PDF_NEED ?= book book-zh
pdf: install fonts $(PDF_NEED)  ## one PDF per edition (_build/pdf), printed offline by Chromium
	command -v chromium >/dev/null || \
	  { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }
	$(BIN)/python tools/pdf.py

BROWSER_NEED ?= book book-zh slides pdf
browser-test: $(BROWSER_NEED)  ## the book, the slides and the student edition in JupyterLab, in headless Chromium
	command -v chromium >/dev/null || \
	  { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }
	$(BIN)/python -m pytest tests/browser -m browser -q -p no:cacheprovider \
	  $(if $(filter 0,$(WORKERS)),,-n $(WORKERS))

# Jupyter refuses to run as root unless told; containers often are root.
ALLOW_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

# jupyter/labconfig makes JupyterLab open a chapter's .py as a notebook
# (jupytext's viewer by default, as `jupytext-config set-default-viewer
# python` writes it), with no setting in the user's own profile.
LAB_CONFIG := JUPYTER_CONFIG_PATH=$(CURDIR)/jupyter
lab: install $(IPYNB)  ## open the notebooks in JupyterLab (a chapter's .py opens as a notebook)
	$(LAB_CONFIG) $(BIN)/jupyter lab $(ALLOW_ROOT) notebooks

lint: install  ## ruff, 79 columns, and the import contracts
	$(BIN)/ruff check transformer_lite tests notebooks
	$(BIN)/lint-imports
	$(BIN)/ruff format --check --line-length 79 transformer_lite tests

bench: install  ## speed and memory benchmarks (table + bench.json)
	$(BIN)/python -m transformer_lite.bench --json bench.json

bench-profile: install  ## where a training step's time goes, and why a target is missed
	$(BIN)/python -m transformer_lite.bench.profile

# On a machine with a CUDA GPU: attention kernels, host syncs, the CUDA
# tests, chapters 5-8, a 2-process torchrun and the benchmark at GPU sizes,
# in under ten minutes (logs in _build/gpu-check). Without one: a notice.
gpu-check: install  ## check the GPU path end to end (a notice without CUDA)
	$(BIN)/python tools/gpu_check.py

clean:  ## remove build output, caches and generated notebooks
	rm -rf _build notebooks/_build $(IPYNB) .pytest_cache .ruff_cache \
	  .hypothesis bench.json
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean  ## also remove the virtual environment
	rm -rf $(VENV)
