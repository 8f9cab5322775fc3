"""Second-order algorithms through the trainer: state alignment, drift, tracking and compression, checked on
real data (digits) against what the papers define."""

from __future__ import annotations

import pytest
import torch

from fedhf.optim import AMSGradNoBias, MuonAdamW
from fedhf.state import load_checkpoint

from tests.helpers import config, digit_trainer, tiny_resnet, trainable_state


def _record_final_theta(monkeypatch, cls):
    """Every client's Theta at the end of its local steps, in training order."""
    recorded = []
    original = cls.end_round

    def end_round(self):
        original(self)
        recorded.append(self.export_theta())

    monkeypatch.setattr(cls, "end_round", end_round)
    return recorded


def test_fedmuon_broadcasts_the_mean_of_the_clients_momenta_and_logs_their_drift(digits, tmp_path, monkeypatch):
    finals = _record_final_theta(monkeypatch, MuonAdamW)
    imported = []
    original_import = MuonAdamW.import_theta
    monkeypatch.setattr(MuonAdamW, "import_theta", lambda self, theta: imported.append(theta) or original_import(self, theta))
    args = config(tmp_path, algorithm="fedmuon", num_clients=4, clients_per_round=3, num_rounds=2, local_steps=3,
                  save_every_rounds=1, drift_spectral=True)
    trainer = digit_trainer(tiny_resnet(), digits, args, evaluate=False)
    trainer.train()

    first_round = finals[:3]
    groups, _ = load_checkpoint(str(tmp_path / "run" / "checkpoint-1"))
    broadcast = groups["sync_state"]
    assert broadcast.keys() == first_round[0].keys() and broadcast  # the >= 2-D momenta (conv filters, classifier)
    for key in broadcast:
        mean = torch.stack([theta[key] for theta in first_round]).mean(0)
        torch.testing.assert_close(broadcast[key], mean, rtol=1e-6, atol=1e-7)
    # Round 2's clients start from it (round 1 imports nothing: it starts fresh).
    assert len(imported) == 3 and all(torch.equal(theta[k], broadcast[k]) for theta in imported for k in broadcast)

    by_hand = sum(float((theta[k].double() - broadcast[k].double()).pow(2).sum()) for theta in first_round
                  for k in broadcast) / 3
    logged = trainer.federated_history[0]["precond_drift"]
    assert by_hand > 0 and logged == pytest.approx(by_hand, rel=1e-4)
    for key in broadcast:  # FedPAC Fig. 3: the mean spectral norm per tensor, the momenta as (out, rest) matrices
        spectral = sum(float(torch.linalg.matrix_norm((theta[key].double() - broadcast[key].double()).flatten(1),
                                                      ord=2)) for theta in first_round) / 3
        assert spectral > 0
        assert trainer.federated_history[0][f"precond_drift_spectral/{key}"] == pytest.approx(spectral, rel=1e-4)


def test_fadam_gt_with_identical_clients_equals_local_amsgrad(digits, tmp_path):
    """Identical clients (the same data, one full batch) track identical gradients, so y - y_i vanishes (up to the
    float32 rounding of y = sum/N) and FAdamGT is Local AMSGrad with each client's v_hat kept (docs/algorithms.md 2.13)."""
    same = [[7, 7]] * 3  # one row twice: any shuffle gives the same batch

    def run(name, **overrides):
        model = tiny_resnet()
        args = config(tmp_path / name, algorithm="fadam_gt", algorithm_kwargs={"tracked_fraction": 1.0},
                      num_clients=3, clients_per_round=3, num_rounds=3, local_steps=2, per_device_train_batch_size=2,
                      **overrides)
        digit_trainer(model, digits, args, evaluate=False, client_partitions=same).train()
        return trainable_state(model)

    tracked, plain = run("tracked"), run("plain", correction="none")
    for name in tracked:
        torch.testing.assert_close(tracked[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)
    start = trainable_state(tiny_resnet())
    assert max(float((tracked[n] - start[n]).abs().max()) for n in tracked) > 1e-3  # it did train


def test_fadam_gt_tracking_changes_training_on_skewed_clients(digits, tmp_path):
    def run(name, **overrides):
        model = tiny_resnet()
        args = config(tmp_path / name, algorithm="fadam_gt", num_clients=4, clients_per_round=4, num_rounds=3,
                      local_steps=2, dirichlet_alpha=0.1, **overrides)
        digit_trainer(model, digits, args, evaluate=False).train()
        return trainable_state(model)

    tracked, plain = run("tracked"), run("plain", correction="none")
    assert max(float((tracked[n] - plain[n]).abs().max()) for n in tracked) > 1e-3


def test_persist_local_keeps_each_clients_v_hat_for_its_next_round(digits, tmp_path, monkeypatch):
    finals = _record_final_theta(monkeypatch, AMSGradNoBias)
    args = config(tmp_path, algorithm="fadam_et", num_clients=2, clients_per_round=2, num_rounds=2, local_steps=2)
    trainer = digit_trainer(tiny_resnet(), digits, args, evaluate=False)
    trainer.train()
    for client in (0, 1):  # full participation, clients train in id order
        stored = trainer.client_store.get(client, "optimizer_theta")
        assert stored.keys() == finals[2 + client].keys()
        assert all(torch.equal(stored[k], finals[2 + client][k]) for k in stored)
    # AMSGrad's max carries across rounds: round 2's v_hat is never below round 1's.
    assert all(torch.all(finals[2][k] >= finals[0][k]) for k in finals[0])


def test_compressed_sync_sends_fewer_bytes_than_the_dense_average(digits, tmp_path):
    def uplink(name):
        args = config(tmp_path / name, algorithm=name, num_clients=4, clients_per_round=2, num_rounds=1,
                      local_steps=2)
        trainer = digit_trainer(tiny_resnet(), digits, args, evaluate=False)
        return trainer.train().metrics["uplink_MB"] * 2**20

    dense, compressed, none = uplink("fedmuon"), uplink("fedmuon_svd"), uplink("local_muon")
    # Muon's tensors: the classifier and every conv filter, each as its matrix (shape[0], rest).
    shapes = [(p.shape[0], p[0].numel()) for p in tiny_resnet().parameters() if p.ndim >= 2]
    assert len(shapes) > 1
    assert dense - none == pytest.approx(2 * 4 * sum(m * n for m, n in shapes))  # two clients, each in full
    # rank r = max(1, floor(0.05 m n / (m + n + 1))): u (m r) + s (r) + v (n r) floats, or dense when not smaller
    sent = [min(m * n, max(1, int(0.05 * m * n / (m + n + 1))) * (m + n + 1)) for m, n in shapes]
    assert sum(sent) < sum(m * n for m, n in shapes)
    assert compressed - none == pytest.approx(2 * 4 * sum(sent))
