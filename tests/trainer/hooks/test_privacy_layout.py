"""Secure aggregation with a correction that only some clients send (parameter tracking's ``dy``, sent by the
clients of Y_r alone): every client of the round sends the correction's full layout, zeros where it has no value,
so the pair masks cancel and the decoding's offsets match (fedhf/trainer/hooks/privacy.py, ``pad_to_layout``).
On the tiny reference run of fedhf/interactions/reference.py, at 28 bits on [-1000, 1000] (one step 7.5e-6)."""

from __future__ import annotations

import pytest
import torch
from transformers import PrinterCallback

from fedhf import FederatedConfig, FederatedTrainer, RoundHook
from fedhf.interactions import reference
from fedhf.privacy import SecAggCodec

BITS, RANGE = 28, 1000.0
SECURE = {"secure_aggregation": True, "secagg_bits": BITS, "secagg_range": RANGE}
STEP = SecAggCodec(BITS, RANGE, 0).step
COHORT = reference.BASE["clients_per_round"]


class _CorrectionStates(RoundHook):
    """The server's correction state (tracking's y) after every round."""

    def __init__(self) -> None:
        self.states = []

    def after_round(self, trainer, run, entry: dict) -> bool:
        self.states.append({k: v.detach().double().clone() for k, v in run.correction_state.items()})
        return False


def _train(tmp_path, name: str, settings: dict):
    capture = _CorrectionStates()
    args = FederatedConfig(output_dir=str(tmp_path / name), **{**reference.BASE, **settings})
    trainer = FederatedTrainer(model=reference.model(), args=args, train_dataset=reference.rows(),
                               data_collator=reference.collate, round_hooks=[capture])
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    model = {n: p.detach().double().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return model, capture.states


@pytest.mark.parametrize("algorithm", ["fadam_gt", "fadam_et"])  # gradient_tracking, control_variate_post
def test_secure_aggregation_of_the_tracking_sums_is_the_plain_sum(tmp_path, algorithm):
    # round 1 starts both runs from the same model: each client's dy is the same, and the decoded sum differs from
    # the plain one by the stochastic rounding only, under one step per summand (docs/privacy.md); y = sum / N.
    # (Later rounds start from models that differ by that rounding, which Adam's normalised steps magnify.)
    _, plain = _train(tmp_path, "plain", {"algorithm": algorithm})
    _, secure = _train(tmp_path, "secure", {"algorithm": algorithm, **SECURE})
    first_plain, first_secure = plain[0], secure[0]
    assert max(float(v.abs().max()) for v in first_plain.values()) > 1e3 * STEP  # y moved: not a zero twin
    for key in first_plain:
        assert torch.allclose(first_secure[key], first_plain[key], rtol=0.0, atol=COHORT * STEP), key


@pytest.mark.parametrize("correction", ["gradient_tracking", "control_variate_post"])
def test_secure_aggregation_with_parameter_tracking_ends_at_the_plain_model(tmp_path, correction):
    # local SGD: the rounding's error stays of its size; at most one step per summand of each round's mean
    plain, _ = _train(tmp_path, "plain", {"correction": correction})
    secure, _ = _train(tmp_path, "secure", {"correction": correction, **SECURE})
    tolerance = reference.BASE["num_rounds"] * COHORT * STEP
    initial = dict(reference.model().named_parameters())
    assert max(float((plain[k] - initial[k].double()).abs().max()) for k in plain) > 10 * tolerance  # it trained
    for key in plain:
        assert torch.allclose(secure[key], plain[key], rtol=0.0, atol=tolerance), key
