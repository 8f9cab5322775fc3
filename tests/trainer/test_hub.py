"""The model card beside every saved model (base model by Hub id, never a local path; the federated section) and
the Hub checks before any work; no network."""

from __future__ import annotations

import os

import datasets
import huggingface_hub
import pytest
import torch
import yaml
from transformers import BitsAndBytesConfig, DataCollatorWithPadding

from fedhf import FederatedConfig, FederatedTrainer
from fedhf.data import bundled_gemma
from fedhf.runtime.quantization import keep_trainable_4bit_layout
from fedhf.trainer.hub import base_model_license, hub_base_model

from tests.helpers import config, digit_trainer, lora_minilm, tiny_resnet, tweet_trainer

HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def _front_matter(card: str) -> dict:
    return yaml.safe_load(card.split("---\n")[1])


def test_base_model_is_a_hub_id_or_nothing(minilm):
    model = lora_minilm(minilm)
    assert hub_base_model(model) is None  # loaded from a local folder: the path is never published
    model.peft_config["default"].base_model_name_or_path = HUB_ID
    assert hub_base_model(model) == HUB_ID
    assert hub_base_model(tiny_resnet()) is None


def test_a_model_from_the_bundled_gemma_cache_names_gemma_and_its_license(minilm, tmp_path):
    """A cache folder fedhf built (its manifest) is published as the Hub model it came from, with its license;
    any other local folder stays unnamed."""
    model = lora_minilm(minilm)
    folder = tmp_path / bundled_gemma.NAME
    folder.mkdir()
    model.peft_config["default"].base_model_name_or_path = str(folder)
    assert hub_base_model(model) is None and base_model_license(model) is None
    (folder / bundled_gemma.MANIFEST).write_text(
        '{"base_model": "google/gemma-3-270m", "license": "gemma", "files": {}}')
    assert hub_base_model(model) == "google/gemma-3-270m"
    assert base_model_license(model) == "gemma"


def test_save_model_writes_the_federated_card_beside_the_adapter(minilm, tweets, tokenizer, tmp_path):
    model = lora_minilm(minilm)
    args = config(tmp_path, num_rounds=1, local_steps=1, eval_every_rounds=1, save_every_rounds=1,
                  algorithm="fedprox")
    trainer = tweet_trainer(model, tweets, tokenizer, args)
    trainer.train()
    trainer.save_model()
    run = tmp_path / "run"
    for folder in (run, run / "checkpoint-1" / "model"):
        assert (folder / "adapter_model.safetensors").exists()
        card = (folder / "README.md").read_text()
        assert minilm not in card and "base_model" not in _front_matter(card)  # peft's local path is replaced
        meta = _front_matter(card)
        assert {"fedhf", "federated-learning", "fedprox"} <= set(meta["tags"])
        for row in ("## Federated training (fedhf)", "**fedprox**", "| clients (N) | 4 |", "| rounds (R) | 1 |",
                    "| local steps per round (K) | 1 |", "| seed | 0 |", "| fedhf version | 0.1.0 |",
                    "local optimizer / state sync / correction / server rule", "label skew", "communicated"):
            assert row in card, row
    assert "final eval_accuracy" in (run / "README.md").read_text()


def test_card_names_the_hub_base_model(minilm, tweets, tokenizer, tmp_path):
    model = lora_minilm(minilm)
    model.peft_config["default"].base_model_name_or_path = HUB_ID
    trainer = tweet_trainer(model, tweets, tokenizer, config(tmp_path, num_rounds=1, local_steps=1))
    trainer.save_model()
    card = (tmp_path / "run" / "README.md").read_text()
    assert _front_matter(card)["base_model"] == HUB_ID and f"https://huggingface.co/{HUB_ID}" in card


def test_push_to_hub_offline_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="`push_to_hub=True`.*offline.*HF_HUB_OFFLINE"):
        FederatedConfig(output_dir=str(tmp_path / "run"), report_to="none", push_to_hub=True, hub_model_id="me/m")
    assert not (tmp_path / "run").exists()


def test_push_to_hub_without_a_token_names_hf_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ValueError, match="no Hugging Face token.*HF_TOKEN.*hub_model_id.*push_to_hub=False"):
        FederatedConfig(output_dir=str(tmp_path / "run"), report_to="none", push_to_hub=True, hub_model_id="me/m")
    assert not (tmp_path / "run").exists()


class _FakeHub:
    """Stands in for the Hub: records what HfApi.create_repo / create_commit were asked to do."""

    def __init__(self):
        self.repos, self.commits = [], []

    def install(self, monkeypatch):
        hub = self

        def create_repo(api, repo_id, **kwargs):
            hub.repos.append(repo_id)
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def create_commit(api, repo_id, operations, commit_message, **kwargs):
            hub.commits.append((repo_id, commit_message, sorted(op.path_in_repo for op in operations)))

        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_not_a_real_token")
        monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
        monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", create_commit)
        return hub


@pytest.mark.parametrize("strategy, prefix", [("every_save", ""), ("all_checkpoints", "checkpoint-{r}/")])
def test_round_checkpoints_are_pushed_as_hub_strategy_says(digits, tmp_path, monkeypatch, strategy, prefix):
    hub = _FakeHub().install(monkeypatch)
    args = config(tmp_path, num_rounds=2, local_steps=1, save_every_rounds=1, push_to_hub=True,
                  hub_model_id="me/fed-digits", hub_strategy=strategy)
    digit_trainer(tiny_resnet(), digits, args, evaluate=False).train()
    assert hub.repos == ["me/fed-digits"]
    assert [(repo, message) for repo, message, _ in hub.commits] == [
        ("me/fed-digits", "fedhf: global model after round 1"), ("me/fed-digits", "fedhf: global model after round 2")]
    for r, (_, _, files) in enumerate(hub.commits, 1):
        p = prefix.format(r=r)
        assert files == sorted([f"{p}README.md", f"{p}config.json", f"{p}model.safetensors"])


def test_hub_strategy_end_pushes_no_round_checkpoint(digits, tmp_path, monkeypatch):
    hub = _FakeHub().install(monkeypatch)
    args = config(tmp_path, num_rounds=1, local_steps=1, save_every_rounds=1, push_to_hub=True,
                  hub_model_id="me/fed-digits", hub_strategy="end")
    digit_trainer(tiny_resnet(), digits, args, evaluate=False).train()
    assert hub.commits == []


def test_card_names_the_split_key_quantity_skew_and_held_out_rows(tmp_path):
    from fedhf.trainer.hub import federated_card_section

    args = config(tmp_path, partition_key="length", partition_column="text", quantity_skew=1.0,
                  client_eval_fraction=0.1)
    summary = {"key": "length of `text` in characters (4 quantile buckets)", "sizes": [50, 20]}
    card = federated_card_section(args, args.build_algorithm(), summary, [])
    assert ("| partition | dirichlet (alpha=0.5, key length of `text` in characters (4 quantile buckets)), power-law "
            "sizes (exponent 1.0), 0.1 of each client's rows held out |") in card


def test_card_states_sharing_folding_lora_ranks_accumulation_and_small_mb(tmp_path):
    from fedhf.trainer.hub import SavedModel, model_card

    args = config(tmp_path, server_rule="flora", parameter_sharing="personal_head", lora_client_ranks=[2, 4, 4, 4],
                  gradient_accumulation_steps=3)
    lora = {"r": 4, "alpha": 8, "rslora": True, "targets": ["q_proj", "v_proj"]}
    history = [{"round": 1, "communicated_MB": 0.0123, "eval_loss": 2.5}, {"round": 2, "communicated_MB": 0.0246,
                                                                           "eval_loss": 2.0}]
    merged = model_card(args, args.build_algorithm(), {}, history, None, SavedModel("merged", "LlamaForCausalLM",
                                                                                      lora, 1))
    for row in ("library_name: transformers", "| parameter sharing | personal_head", "weighted mean",
                "| base weights | changed every round", "| LoRA | r=4, alpha=8, rsLoRA=True, target modules "
                "['q_proj', 'v_proj'] |", "| LoRA client ranks | [2, 4, 4, 4] |",
                "| local batch size x gradient accumulation steps | 16 x 3 |",
                "| communicated (up + down) | 0.0246 MB |", "| final eval_loss (saved model, round 1) | 2.5000 |",
                "LlamaForCausalLM.from_pretrained(PATH_OR_REPO_ID)", "merge_and_unload"):
        assert row in merged, row
    assert "round 2" not in merged
    adapter = model_card(config(tmp_path), config(tmp_path).build_algorithm(), {}, history, None,
                         SavedModel("adapter", "LlamaForCausalLM", lora, None))
    for row in ("library_name: peft", "| base weights | frozen |", "PeftModel.from_pretrained(base, PATH_OR_REPO_ID)",
                "| final eval_loss (saved model, round 2) | 2.0000 |", "every trained tensor is global"):
        assert row in adapter, row


def test_a_model_from_the_bundled_gemma_publishes_the_hub_id_its_quantisation_and_the_terms_notice(tmp_path):
    """Trained from a stand-in of the bundled cache (a saved tiny Llama with fedhf's manifest): the saved
    adapter_config.json names the Hub id the card names, not the local cache folder (which others could not load
    and which shows the user's home); the card says the base is a Q4_K_M de-quantisation and carries the Gemma
    terms' notice, and a NOTICE file is written beside the adapter."""
    import json

    import datasets
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    from fedhf import FederatedTrainer
    from fedhf.data.demo import tiny_llama

    folder = str(tmp_path / "home" / bundled_gemma.NAME)
    tiny_llama(64, hidden_size=16, num_layers=1).save_pretrained(folder)
    manifest = {"name": bundled_gemma.NAME, "base_model": bundled_gemma.BASE_MODEL, "license": bundled_gemma.LICENSE,
                "source": bundled_gemma.GGUF_FILE, "source_sha256": bundled_gemma.GGUF_SHA256,
                "files": bundled_gemma._file_records(folder)}
    (tmp_path / "home" / bundled_gemma.NAME / bundled_gemma.MANIFEST).write_text(json.dumps(manifest))
    assert bundled_gemma.cache_is_valid(folder)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder),
                           LoraConfig(r=2, target_modules=["q_proj"], task_type=TaskType.CAUSAL_LM))
    ids = torch.randint(1, 64, (16, 8), generator=torch.Generator().manual_seed(0)).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 8] * 16, "labels": ids})
    args = config(tmp_path, num_clients=2, clients_per_round=2, num_rounds=1, local_steps=1,
                  per_device_train_batch_size=8, partition="iid", partition_report=False, eval_every_rounds=0)
    trainer = FederatedTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))  # what push_to_hub uploads
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == bundled_gemma.BASE_MODEL
    card = (out / "README.md").read_text()
    assert _front_matter(card)["base_model"] == bundled_gemma.BASE_MODEL and folder not in card
    assert "Q4_K_M de-quantisation" in card and "Gemma Terms of Use found at ai.google.dev/gemma/terms" in card
    assert (out / "NOTICE").read_text().startswith("Gemma is provided under and subject to the Gemma Terms of Use")


def load_code(card: str, folder, base: str = None) -> str:
    """The card's "how to load" code block, its placeholders filled as a user would: the folder, and the base only
    where the card cannot name it (a local folder)."""
    code = card.split("### What the upload contains", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    if base is not None:
        code = code.replace('BASE_MODEL = "..."', f"BASE_MODEL = {base!r}")
    return code.replace("PATH_OR_REPO_ID", repr(str(folder)))


def _run(code: str):
    scope = {}
    exec(compile(code, "card", "exec"), scope)  # noqa: S102 -- the card's own snippet, the test's subject
    return scope["model"].eval()


def _bundled_gemma_stand_in(folder: str) -> str:
    """A saved tiny Llama with fedhf's bundled-Gemma manifest: the same code path as the real 270M cache, in a
    fraction of a second (the real one takes minutes to build and seconds to load)."""
    import json

    from fedhf.data.demo import tiny_llama

    tiny_llama(64, hidden_size=16, num_layers=1).save_pretrained(folder)
    manifest = {"name": bundled_gemma.NAME, "base_model": bundled_gemma.BASE_MODEL, "license": bundled_gemma.LICENSE,
                "source": bundled_gemma.GGUF_FILE, "source_sha256": bundled_gemma.GGUF_SHA256,
                "files": bundled_gemma._file_records(folder)}
    with open(os.path.join(folder, bundled_gemma.MANIFEST), "w") as f:
        json.dump(manifest, f)
    assert bundled_gemma.cache_is_valid(folder)
    return folder


def _hub_cache_with(tmp_path, repo_id: str, save) -> None:
    """A Hub cache (huggingface_hub's layout: refs/main -> snapshots/<commit>/) holding ``repo_id``, so that
    ``from_pretrained(repo_id)`` resolves offline, as it does for a model downloaded earlier."""
    commit = "0" * 40
    repo = tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    save(str(repo / "snapshots" / commit))


LOAD_KINDS = ["bundled-minilm", "bundled-gemma", "hub", "local", "local-bf16", "local-nf4"]


@pytest.mark.parametrize("kind", LOAD_KINDS)
def test_the_cards_load_code_loads_the_saved_model(minilm, tweets, tokenizer, tmp_path, monkeypatch, kind):
    """The snippet a user copies from the card gives back the saved model (same outputs), offline, for every kind
    of base: fedhf's bundled MiniLM (a classifier: with its num_labels) and bundled Gemma (a tiny stand-in with the
    cache's manifest, gemma_3_270m_path() pointed at it) through their path helpers, a Hub id as it is, and a
    local folder through the placeholder the user fills; each base loads in the dtype it was trained in (bfloat16
    here for one; a checkpoint's stored dtype is what from_pretrained would pick otherwise)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    from fedhf.data.sft import SFTCollator

    from tests.helpers import tiny_llama_dir, tweet_sft

    args = config(tmp_path, num_rounds=1, local_steps=1, clients_per_round=2)
    if kind == "bundled-minilm":
        model = lora_minilm(minilm)
        trainer = tweet_trainer(model, tweets, tokenizer, args, evaluate=False)
        batch = DataCollatorWithPadding(tokenizer)([tweets["test"][i] for i in range(4)])
        batch = {k: v for k, v in batch.items() if k != "labels"}
    else:
        if kind == "bundled-gemma":
            base = _bundled_gemma_stand_in(str(tmp_path / bundled_gemma.NAME))
            monkeypatch.setattr(bundled_gemma, "gemma_3_270m_path", lambda cache_dir=None: base)
        elif kind == "hub":
            monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
            _hub_cache_with(tmp_path, "fedhf-test/tiny-llama", lambda path: tiny_llama_dir(path, tokenizer))
            base = "fedhf-test/tiny-llama"
        else:
            base = tiny_llama_dir(str(tmp_path / "tiny_llama"), tokenizer)
        dtype = torch.bfloat16 if kind == "local-bf16" else torch.float32
        quantized = {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
                     "device_map": "cpu"} if kind == "local-nf4" else {}
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=dtype, **quantized), LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type=TaskType.CAUSAL_LM))
        vocab = model.config.vocab_size
        if kind == "bundled-gemma":
            ids = torch.randint(1, vocab, (32, 8), generator=torch.Generator().manual_seed(0)).tolist()
            data = datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * 8] * 32, "labels": ids})
            args = config(tmp_path, num_rounds=1, local_steps=1, clients_per_round=2, partition="iid")
            trainer = FederatedTrainer(model=model, args=args, train_dataset=data)
            batch = {"input_ids": torch.tensor(ids[:2])}
        else:
            data = tweet_sft(tokenizer, n_train=64, n_test=4)
            trainer = FederatedTrainer(model=model, args=args, train_dataset=data["train"],
                                       data_collator=SFTCollator(tokenizer))
            batch = {"input_ids": torch.tensor([data["test"][0]["input_ids"]])}
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    card = (tmp_path / "final" / "README.md").read_text()
    expected = {"bundled-minilm": "from fedhf.data.demo import minilm_path\n",
                "bundled-gemma": "from fedhf.data.bundled_gemma import gemma_3_270m_path\n",
                "hub": "BASE_MODEL = 'fedhf-test/tiny-llama'\n", "local": 'BASE_MODEL = "..."',
                "local-bf16": "from_pretrained(BASE_MODEL, dtype='bfloat16')",
                "local-nf4": "from_pretrained(BASE_MODEL, dtype='float32', quantization_config=BitsAndBytesConfig("
                             "bnb_4bit_quant_type='nf4', load_in_4bit=True))"}[kind]
    assert expected in card
    if kind == "bundled-minilm":
        assert "BASE_MODEL = minilm_path()" in card and "from_pretrained(BASE_MODEL, num_labels=3, dtype='float32')" in card
    if kind == "bundled-gemma":  # google's weights only as a commented alternative: not the evaluated base
        assert "BASE_MODEL = gemma_3_270m_path()" in card and "# BASE_MODEL = 'google/gemma-3-270m'" in card
    loaded = _run(load_code(card, tmp_path / "final", base if kind.startswith("local") else None))
    keep_trainable_4bit_layout(loaded)  # nf4: the kernel the run evaluated with, not bitsandbytes' CPU inference one
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, model.eval()(**batch).logits)


def test_create_model_card_honours_trainers_arguments(digits, tmp_path):
    """Trainer's create_model_card(model_name, dataset, tags, language, license, tasks): the title and the
    Hub metadata; a later save_model keeps them (push_to_hub saves, then writes the card)."""
    trainer = digit_trainer(tiny_resnet(), digits, config(tmp_path, num_rounds=1, local_steps=1), evaluate=False)
    trainer.train()
    trainer.create_model_card(model_name="digits-fedavg-demo", dataset="bundled-digits", language="en",
                              tags=["my-tag"], license="mit", tasks="image-classification")
    for card in ((tmp_path / "run" / "README.md").read_text(),):
        meta = _front_matter(card)
        assert "\n# digits-fedavg-demo\n" in card and "# run\n" not in card
        assert meta["datasets"] == ["bundled-digits"] and meta["language"] == ["en"] and meta["license"] == "mit"
        assert meta["pipeline_tag"] == "image-classification"
        assert meta["tags"][:2] == ["fedhf", "federated-learning"] and meta["tags"][-1] == "my-tag"
    trainer.save_model(str(tmp_path / "again"))
    assert "\n# digits-fedavg-demo\n" in (tmp_path / "again" / "README.md").read_text()
    assert "| processes | 1 process (client_parallel: False, FSDP: False)" in (tmp_path / "again" / "README.md").read_text()


def test_push_to_hub_offline_after_training_saves_and_names_the_upload_command(digits, tmp_path, monkeypatch):
    """Offline, push_to_hub() saves what it would upload and says how to upload it later, in fedhf's words (not
    huggingface_hub's OfflineModeIsEnabled)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    trainer = digit_trainer(tiny_resnet(), digits, config(tmp_path, num_rounds=1, local_steps=1), evaluate=False)
    trainer.train()
    with pytest.raises(OSError, match=r"HF_HUB_OFFLINE.*nothing was uploaded.*hf upload YOU/NAME .*run") as err:
        trainer.push_to_hub(model_name="later")
    assert type(err.value) is OSError
    assert (tmp_path / "run" / "model.safetensors").exists()
    assert "\n# later\n" in (tmp_path / "run" / "README.md").read_text()


@pytest.mark.parametrize("storage", [None, torch.bfloat16])
def test_a_bitsandbytes_bases_load_arguments_keep_the_dtype_it_was_trained_in(tmp_path, storage):
    """A checkpoint stored in bfloat16, quantized to nf4 and trained with its other weights in float32: the card's
    from_pretrained arguments (the dtype and the BitsAndBytesConfig) rebuild those float32 weights and the same
    logits; without the dtype, transformers loads the checkpoint's bfloat16 (quantized weights stored as bfloat16
    under bnb_4bit_quant_storage are not the base's dtype)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    from fedhf.data.demo import tiny_llama
    from fedhf.trainer.hub import saved_model

    base = str(tmp_path / "bf16")
    tiny_llama(1000, seed=0).to(torch.bfloat16).save_pretrained(base)
    quantization = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    if storage is not None:
        quantization["bnb_4bit_quant_storage"] = storage
    trained = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, device_map="cpu",
                                                   quantization_config=BitsAndBytesConfig(**quantization))
    saved = saved_model(get_peft_model(trained, LoraConfig(r=4, target_modules=["q_proj"],
                                                           task_type=TaskType.CAUSAL_LM)), False, None)
    assert saved.base_kwargs == {"dtype": "float32"}
    loaded = AutoModelForCausalLM.from_pretrained(base, device_map="cpu", **saved.base_kwargs,
                                                  quantization_config=BitsAndBytesConfig(**saved.quantization))
    model = trained  # with the adapter injected (B = 0: adds exactly nothing)
    for m in (loaded, model):
        keep_trainable_4bit_layout(m)
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
