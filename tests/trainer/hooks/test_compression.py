"""Compression in real runs (tiny ResNet on the digits): the history's uplink/downlink bytes are the encoded sizes,
a client's sent messages plus its residual in the client store add up to its uncompressed messages, and a killed
run with error-feedback state (residuals, PowerSGD's Q, the server's held model) resumes bit for bit."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from fedhf.core.params import federated_buffers
from fedhf.trainer.hooks.compression import RESIDUAL, Compression
from fedhf.trainer.hooks.base import RoundHook
from tests.helpers import config, digit_trainer, tiny_resnet, without_timings
from tests.scripts.resume_run import run_here

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                      "resume_run.py")


def _trainer(tmp_path, name, **kw):
    args = config(tmp_path / name, **{"algorithm": "fedavg", "num_clients": 4, "clients_per_round": 2,
                                       "num_rounds": 2, "local_steps": 2, **kw})
    model = tiny_resnet()
    return model, digit_trainer(model, _trainer.digits, args, evaluate=False)


@pytest.fixture(autouse=True)
def _data(digits):
    _trainer.digits = digits


def _bytes_per_round(history, key):
    totals = [h[key] * 2 ** 20 for h in history]
    return [round(b - a) for a, b in zip([0.0] + totals, totals)]


def _int8(n: int) -> int:
    return n + 4 * math.ceil(n / 256)  # int8 codes + one fp32 scale per 256-value block


def test_history_bytes_are_the_encoded_sizes(tmp_path):
    model, trainer = _trainer(tmp_path, "int8", uplink_compression="int8", downlink_compression="int8")
    trainer.train()
    params = [p.numel() for p in model.parameters() if p.requires_grad]
    buffers = [b.numel() for b in federated_buffers(model).values()]
    dense = 4 * (sum(params) + sum(buffers))  # fp32 parameters and buffers: what one client gets, uncompressed
    history = trainer.federated_history
    encoded_up = sum(_int8(n) for n in params + buffers)  # every dx and buf tensor, 2 clients a round
    assert _bytes_per_round(history, "uplink_MB") == [2 * encoded_up] * 2
    # the downlink: the first broadcast dense, then the parameters' compressed difference (buffers stay dense)
    encoded_down = sum(_int8(n) for n in params) + 4 * sum(buffers)
    assert _bytes_per_round(history, "downlink_MB") == [2 * dense, 2 * encoded_down]
    assert all(h["uplink_compression_rel_error"] < 0.02 for h in history)
    assert all(h["compression_seconds"] > 0 for h in history)


class _Recorder(RoundHook):
    """Keeps each client's ``dx`` tensors as this hook sees them."""

    def __init__(self):
        self.seen = {}

    def on_client_message(self, trainer, ctx, sent):
        for key, t in sent.own.tensors.items():
            if key.startswith("dx."):
                total = self.seen.setdefault(ctx.client_id, {})
                total[key] = total.get(key, 0) + t.clone()
        return sent


def test_what_a_client_sent_plus_its_residual_is_what_it_would_have_sent(tmp_path, monkeypatch):
    from fedhf.trainer import federated_trainer

    before, after = _Recorder(), _Recorder()
    built = federated_trainer.round_hooks

    def around_compression(trainer):
        hooks = built(trainer)
        at = next(i for i, h in enumerate(hooks) if isinstance(h, Compression))
        return hooks[:at] + [before, hooks[at], after] + hooks[at + 1:]

    monkeypatch.setattr(federated_trainer, "round_hooks", around_compression)
    # two clients, both in both rounds: the second round's message carries the first round's residual
    model, trainer = _trainer(tmp_path, "ef", uplink_compression="topk:0.05", num_clients=2, local_steps=1)
    trainer.train()
    assert before.seen.keys() == after.seen.keys() == {0, 1}
    for cid, uncompressed in before.seen.items():
        residual = trainer.client_store.get(cid, RESIDUAL)
        for key, total in uncompressed.items():
            assert not torch.equal(after.seen[cid][key], total)  # compression changed what was sent
            scale = float(total.abs().max())
            assert (after.seen[cid][key] + residual[key] - total).abs().max() <= 1e-12 * scale


def _start(out_dir, result, *flags) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen([sys.executable, SCRIPT, str(out_dir), str(result), *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen):
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


def test_a_killed_run_with_feedback_state_resumes_bit_for_bit(tmp_path):
    flags = ["--algorithm", "fedavg", "--uplink", "*convolution*=powersgd:2,int4", "--downlink", "int8",
             "--state-budget-mb", "0.05", "--rounds", "3"]  # a budget below one client's residuals: they spill to disk
    killed = _start(tmp_path / "crash", tmp_path / "never.safetensors", "--kill-after", "1", *flags)
    run_here(tmp_path / "full", tmp_path / "full.safetensors", *flags)  # beside the crash
    assert _finish(killed)[0] == -signal.SIGKILL
    checkpoint = load_file(str(tmp_path / "crash" / "checkpoint-1" / "client_store.safetensors"))
    assert any("/compression.residual/" in k for k in checkpoint)
    assert any("/compression.state/" in k for k in checkpoint)  # PowerSGD's warm-started Q
    held = load_file(str(tmp_path / "crash" / "checkpoint-1" / "compression_state.safetensors"))
    assert any(k.startswith("held.model.") for k in held)
    run_here(tmp_path / "crash", tmp_path / "resumed.safetensors", "--resume", *flags)
    full, again = load_file(str(tmp_path / "full.safetensors")), load_file(str(tmp_path / "resumed.safetensors"))
    assert full.keys() == again.keys() and all(torch.equal(full[k], again[k]) for k in full)
    history = [json.loads((tmp_path / d / "federated_history.json").read_text()) for d in ("full", "crash")]
    assert without_timings(history[0]) == without_timings(history[1])


def _server(x):
    from types import SimpleNamespace

    run = SimpleNamespace(global_params={"w": x.clone()}, correction_state={}, sync_state={}, compression_state={},
                          rounds_done=0)
    trainer = SimpleNamespace(args=SimpleNamespace(seed=0), model_device="cpu")
    return run, trainer


@pytest.mark.parametrize("feedback", [True, False])
def test_the_downlink_held_model_catches_up_only_with_feedback(feedback):
    """A fixed server model x, top-k 25 %: with feedback the clients' x_hat gains the next largest quarter of
    x - x_hat every round, so after the dense first broadcast and 4 more it is x bit for bit; without feedback it
    stays top-k(x). The server's own x is back in place after every round's sums, and the broadcast costs the
    encoded bytes."""
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    run, trainer = _server(x)
    hook = Compression(None, "topk:0.25", feedback)
    dense = 4 * x.numel()
    for r in range(6):
        hook.before_round(trainer, run)
        held = run.global_params["w"]
        assert hook.broadcast_bytes(trainer, run, dense) == (dense if r == 0 else 8 * 16)  # 16 values + indices
        hook.after_sums(trainer, run, None)
        assert torch.equal(run.global_params["w"], x)  # the server updates its own model
        run.rounds_done += 1
        if r == 0:
            assert torch.equal(held, x)  # the first broadcast is dense
    if feedback:
        assert torch.equal(held, x)
    else:
        assert int((held != 0).sum()) == 16 and not torch.equal(held, x)
