# The README's two commands. Each is self-contained on a fresh machine: it creates or updates the
# virtual environment, installs (CPU torch first, so nothing can pull a CUDA build), then runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fedhf-installed
TORCH  ?= torch==2.13.0
# Everything runs offline, with caches inside the project.
RUN_ENV := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=$(CURDIR)/.cache/hf \
           TOKENIZERS_PARALLELISM=false PYTHONWARNINGS=ignore::FutureWarning

.PHONY: demo demo-llm test install benchmarks benchmark-algorithms benchmark-lora benchmark-llm benchmark-recipes clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e ".[demo,dev,llm-demo,privacy]"
	$(PY) -c "import torch; assert '+cu' not in torch.__version__, torch.__version__; print('torch', torch.__version__)"
	touch $(STAMP)

demo: $(STAMP)
	$(RUN_ENV) $(PY) -m fedhf train --config recipes/tweets_minilm_lora_scaffold_dir0.3_n12.yaml --output_dir outputs/quickstart \
		--overwrite_output_dir true

# Offline federated LoRA SFT of the pretrained Gemma-3-270M (bundled-gemma-3-270m: built once into .cache, about a
# minute) on the bundled tweets as instructions, Dirichlet over the sentiment, FAdam-GT (the best of three seed
# algorithms at this budget, benchmarks/README.md); zero-shot (round 0) and final generation accuracy, perplexity and
# plots in outputs/sft_llm (examples/sft_llm.py). About 4 minutes on 2 idle CPU cores once the cache is built.
DEMO_LLM_FLAGS ?= --algorithm fadam_gt --learning_rate 1e-3 --lora_r 8 --lora_targets q_proj,v_proj \
	--num_rounds 8 --local_steps 5 --num_clients 20 --clients_per_round 4 --dirichlet_alpha 0.5 \
	--per_device_train_batch_size 8 --gradient_accumulation_steps 1 --train_rows 2000 --max_length 64 \
	--eval_rows 64 --generation_rows 200 --eval_every_rounds 4 --eval_on_start true --disable_tqdm true
demo-llm: $(STAMP)
	$(RUN_ENV) $(PY) examples/sft_llm.py --model_name_or_path bundled-gemma-3-270m --dataset bundled-tweets-instructions \
		$(DEMO_LLM_FLAGS) --output_dir outputs/sft_llm --overwrite_output_dir

test: $(STAMP)
	$(RUN_ENV) $(PY) -m pytest -q -x tests

# optimizer_cost.py compares against pytorch-optimizer's SOAP/SophiaH: its requirements (torch, numpy) are
# already installed, and --no-deps keeps pip from touching torch (so no CUDA build can come in).
BENCH_DEPS ?= pytorch-optimizer==3.11.0
benchmarks: $(STAMP)
	$(PY) -m pip install --no-deps $(BENCH_DEPS)
	$(RUN_ENV) $(PY) benchmarks/overhead.py | grep -v "^{" | tee benchmarks/overhead_result.txt
	$(RUN_ENV) $(PY) benchmarks/memory.py | tee benchmarks/memory_result.txt
	$(RUN_ENV) $(PY) benchmarks/optimizer_cost.py | tee benchmarks/optimizer_cost_result.txt
	$(RUN_ENV) $(PY) benchmarks/batched_clients.py | tee benchmarks/batched_clients_result.txt
	$(RUN_ENV) $(PY) benchmarks/batched_clients.py --model minilm --seq 64 | tee benchmarks/batched_clients_minilm_result.txt
	$(RUN_ENV) $(PY) benchmarks/memory_plan.py | tee benchmarks/memory_plan_result.txt

# The algorithm comparison at the papers' defaults, then with each algorithm's lr tuned on validation rows (tweets,
# digits, the LLM task): hours on 2 CPU cores; every run is stored, so an interrupted comparison resumes.
benchmark-algorithms: $(STAMP)
	$(RUN_ENV) $(PY) benchmarks/algorithms.py --budget full
	$(RUN_ENV) $(PY) benchmarks/algorithms.py --budget full --tune --datasets digits,tweets,llm

# LoRA aggregation rules (FedEx-LoRA, FLoRA, FlexLoRA, FedSVD, FFA-LoRA, RoLoRA) against plain averaging, tweets and the LLM task.
benchmark-lora: $(STAMP)
	$(RUN_ENV) $(PY) benchmarks/lora_federation.py --budget full

# The paper recipes run to their end, each paper's algorithm and baselines over 3 seeds, ours beside the paper's
# figure (benchmarks/paper_recipes_result.md); about 1.5 hours on 2 CPU cores, resumable.
benchmark-recipes: $(STAMP)
	$(RUN_ENV) $(PY) benchmarks/paper_recipes.py

# The LLM path: a federated LoRA round against a plain loop (fp32, gradient checkpointing, 4-bit); a few minutes.
benchmark-llm: $(STAMP)
	$(RUN_ENV) $(PY) benchmarks/llm.py | tee benchmarks/llm_result.txt
	$(RUN_ENV) $(PY) benchmarks/llm_gemma.py | tee benchmarks/llm_gemma_result.txt

clean:
	rm -rf $(VENV) outputs .cache
