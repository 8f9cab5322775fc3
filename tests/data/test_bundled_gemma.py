"""bundled-gemma-3-270m: the cache is checked whole (a partial or changed file is rebuilt), two builders take turns,
a missing extra is named, and the real build gives a pretrained Gemma that loads with plain transformers calls."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from fedhf.data import bundled_gemma


def _fake_build(calls):
    def assemble(work):
        path = os.path.join(work, bundled_gemma.GGUF_FILE)
        open(path, "wb").write(b"gguf")
        return path

    def dequantise(gguf_path, out):
        calls.append(out)
        os.makedirs(out)
        open(os.path.join(out, "config.json"), "w").write("{}")
        open(os.path.join(out, "model.safetensors"), "wb").write(os.urandom(4096))

    return assemble, dequantise


@pytest.fixture
def fake_build(monkeypatch):
    calls = []
    assemble, dequantise = _fake_build(calls)
    monkeypatch.setattr(bundled_gemma, "check_installed", lambda: None)
    monkeypatch.setattr(bundled_gemma, "_assemble", assemble)
    monkeypatch.setattr(bundled_gemma, "_dequantise", dequantise)
    return calls


def test_a_cache_is_built_once_and_reused(tmp_path, fake_build):
    first = bundled_gemma.gemma_3_270m_path(str(tmp_path))
    assert bundled_gemma.cache_is_valid(first) and len(fake_build) == 1
    assert bundled_gemma.gemma_3_270m_path(str(tmp_path)) == first and len(fake_build) == 1
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no build folder left behind


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest", "other_source", "added_file"])
def test_a_partial_or_changed_cache_is_detected_and_rebuilt(tmp_path, fake_build, damage):
    folder = bundled_gemma.gemma_3_270m_path(str(tmp_path))
    weights, manifest = os.path.join(folder, "model.safetensors"), os.path.join(folder, bundled_gemma.MANIFEST)
    if damage == "truncate":
        os.truncate(weights, 100)
    elif damage == "flip":
        data = bytearray(open(weights, "rb").read())
        data[7] ^= 1
        open(weights, "wb").write(bytes(data))
    elif damage == "no_manifest":
        os.remove(manifest)
    elif damage == "added_file":  # from_pretrained would load an added adapter over the base: another model
        open(os.path.join(folder, "adapter_config.json"), "w").write("{}")
    else:
        open(manifest, "w").write(open(manifest).read().replace(bundled_gemma.GGUF_SHA256, "0" * 64))
    assert not bundled_gemma.cache_is_valid(folder)
    assert bundled_gemma.gemma_3_270m_path(str(tmp_path)) == folder and len(fake_build) == 2
    assert bundled_gemma.cache_is_valid(folder)


def test_two_builders_at_once_build_once(tmp_path, fake_build, monkeypatch):
    _, dequantise = _fake_build(fake_build)
    started = threading.Event()

    def slow(gguf_path, out):
        started.set()
        threading.Event().wait(0.5)  # the other builder arrives while this one builds
        dequantise(gguf_path, out)

    monkeypatch.setattr(bundled_gemma, "_dequantise", slow)
    results = []
    threads = [threading.Thread(target=lambda: results.append(bundled_gemma.gemma_3_270m_path(str(tmp_path))))
               for _ in range(2)]
    threads[0].start()
    started.wait(5)
    threads[1].start()
    for t in threads:
        t.join(30)
    assert len(results) == 2 and results[0] == results[1] and len(fake_build) == 1
    assert bundled_gemma.cache_is_valid(results[0])


def test_without_the_extra_the_name_fails_at_once_naming_it(monkeypatch):
    def missing(name):
        raise bundled_gemma.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(bundled_gemma.importlib.metadata, "version", missing)
    with pytest.raises(ImportError, match=r"fedhf\[llm-demo\]"):
        bundled_gemma.gemma_3_270m_path("/nonexistent/never-written")
    assert not os.path.exists("/nonexistent")


def test_the_real_build_is_a_pretrained_gemma_that_plain_transformers_loads(gemma_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gemma_dir)
    model = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32)
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.vocab_size == 262_144
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
        sentence = tokenizer("The cat sat on the mat and looked out of the window.", return_tensors="pt")
        loss = model(**sentence, labels=sentence["input_ids"]).loss.item()
    continuation = tokenizer.decode(out[0, ids["input_ids"].shape[1]:])
    assert "France" in continuation  # greedy: " the capital of the country of France."
    assert loss < 6.0  # a pretrained model; random weights give about ln(262144) = 12.5 nats per token
    origin = bundled_gemma.bundled_origin(gemma_dir)
    assert (origin["base_model"], origin["license"]) == ("google/gemma-3-270m", "gemma")
    assert "Q4_K_M de-quantisation" in origin["card_note"] and "ai.google.dev/gemma/terms" in origin["notice"]
