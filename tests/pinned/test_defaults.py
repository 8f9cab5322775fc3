"""Every named algorithm's defaults, pinned against the paper values of docs/algorithms.md section 2:
the local optimizer's effective hyper-parameters (read from the optimizer a client round builds), the correction,
the state-sync rule and the server rule, in one table. A changed default or a swapped axis fails its row."""

from __future__ import annotations

import pytest
import torch

from fedhf.algorithms import get_algorithm, list_algorithms
from fedhf.optim import MuonAdamW

_TORCH_FLAGS = {"params", "foreach", "maximize", "capturable", "differentiable", "fused", "decoupled_weight_decay",
                "initial_lr"}


def optimizer_settings(algo) -> dict:
    """The hyper-parameters the optimizer of a client round really runs with (at the peak lr)."""
    params = {"w": torch.nn.Parameter(torch.zeros(2, 2)), "b": torch.nn.Parameter(torch.zeros(2))}
    opt = algo.local_optimizer.build(params, algo.local_optimizer.lr)
    groups = ({"muon.": opt.muon.param_groups[0], "aux.": opt.adamw.param_groups[0]} if isinstance(opt, MuonAdamW)
              else {"": opt.param_groups[0]})
    out = {"optimizer": algo.local_optimizer.cls.__name__}
    out.update({prefix + k: v for prefix, g in groups.items() for k, v in g.items() if k not in _TORCH_FLAGS})
    for attribute in ("momentum_form", "ortho", "eigenbasis_refresh", "momentum_in_theta", "hessian_estimator",
                      "hess_interval", "hessian_grad_clip", "amsgrad", "fresh_bias_correction", "damping",
                      "curvature_samples"):
        if hasattr(opt, attribute):
            out[attribute] = getattr(opt, attribute)
    out.pop("hessian_batch_size", None)  # Sophia's bs of the last refresh: state, not a setting
    return out


def component(obj) -> tuple:
    return type(obj).__name__, {k: v for k, v in vars(obj).items() if k != "name"}


def settings(name: str) -> dict:
    algo = get_algorithm(name)
    rule = algo.server_rule
    return {"optimizer": optimizer_settings(algo), "correction": component(algo.correction),
            "state_sync": component(algo.state_sync),
            "server": (component(rule.aggregator), [component(t) for t in rule.transforms])}


# ------------------------------------------------------------------ the paper values (docs/algorithms.md section 2)
def sgd(lr, wd, momentum=0.0):  # 1.1: coupled wd, no momentum in the FedPAC/FedMuon baselines
    return {"optimizer": "SGD", "lr": lr, "momentum": momentum, "dampening": 0, "weight_decay": wd, "nesterov": False}


def muon(momentum):  # 1.3 / 2.1 "Local Muon: lr 3e-2, b1 0.9, b2 0.95 (aux Adam), momentum 0.95, wd 0.01"
    return {"optimizer": "MuonAdamW", "muon.lr": 3e-2, "muon.weight_decay": 0.01, "muon.momentum": momentum,
            "muon.nesterov": True, "muon.ns_coefficients": (3.4445, -4.775, 2.0315), "muon.eps": 1e-7,
            "muon.ns_steps": 5, "muon.adjust_lr_fn": None, "aux.lr": 3e-4, "aux.betas": (0.9, 0.95),
            "aux.eps": 1e-10, "aux.weight_decay": 0.01, "aux.amsgrad": False,
            "momentum_form": "ema", "ortho": "ns5"}  # 5.4: Keller Jordan's form by default


SOAP = {"optimizer": "SOAP", "lr": 3e-3, "betas": (0.95, 0.95), "shampoo_beta": 0.95, "eps": 1e-8,  # 1.4, 2.1, 2.9b
        "weight_decay": 0.01, "precondition_frequency": 10, "max_precond_dim": 10000, "precondition_1d": False,
        "correct_bias": True, "factor_update": "after", "eigenbasis_refresh": "sorted"}  # the authors' code order
SOPHIA = {"optimizer": "Sophia", "lr": 3e-4, "betas": (0.9, 0.99), "rho": 0.01, "weight_decay": 0.01,  # 2.1, 2.9c
          "eps": 1e-15, "hessian_estimator": "gnb", "hess_interval": 10, "hessian_grad_clip": None,  # 1.5, 5.7
          "momentum_in_theta": False}  # m restarts each round (2.1, 2.9c)
FOOF = {"optimizer": "FOOF", "lr": 0.3, "weight_decay": 1e-4, "damping": 1.0, "curvature_samples": None}  # 2.10
FADAM = {"optimizer": "AMSGradNoBias", "lr": 1e-3, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 1e-8,
         "amsgrad": True, "fresh_bias_correction": False}  # 2.13, sec. 6.1 (no bias correction in any round)

NONE = ("Correction", {})
MIX_AFTER = ("GlobalMix", {"beta": 0.5, "position": "after"})  # FedPAC beta 0.5 (5.3), FedMuon alpha 0.5 (2.8)
RESET, PERSIST, AVERAGE = ("Reset", {}), ("PersistLocal", {"keep": "theta"}), ("AverageWarmstart", {})
KEEP_STATE = ("PersistLocal", {"keep": "state"})  # 2.16: each worker's inner optimizer is never touched
MEAN = (("Mean", {}), [("Step", {"lr": 1.0})])  # eta_g = 1


def adaptive(kind):  # 2.6: b1 0.9, b2 0.99, tau 1e-3, server lr 0.03 (FedPM Table 4)
    return (("Mean", {}), [("AdaptiveServer", {"kind": kind, "lr": 0.03, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3})])


EXPECTED = {
    "fedavg": (sgd(0.1, 1e-3), NONE, RESET, MEAN),  # 2.1 FedPAC Table 8
    "local_adamw": ({"optimizer": "AdamW", "lr": 3e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                     "amsgrad": False}, NONE, RESET, MEAN),  # 1.2 / 2.1
    "local_muon": (muon(0.95), NONE, RESET, MEAN),
    "desloc": ({"optimizer": "AdamW", "lr": 3e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
                "amsgrad": False}, NONE,  # 2.17: the paper's recommended K_u = 3 K_x, K_v = 6 K_x
               ("DesLoc", {"first_moment_period": 3, "second_moment_period": 6}), MEAN),
    "local_soap": (SOAP, NONE, RESET, MEAN),
    "local_sophia": (SOPHIA, NONE, RESET, MEAN),
    "fedavgm": (sgd(0.1, 1e-4), NONE, RESET,
                (("Mean", {}), [("ServerMomentum", {"lr": 1.0, "beta": 0.9, "nesterov": False})])),  # 2.2 FedPM Table 4
    "diloco": ({"optimizer": "AdamW", "lr": 4e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1,
                "amsgrad": False}, NONE, KEEP_STATE,  # 2.16: outer Nesterov SGD, lr 0.7, momentum 0.9
               (("Mean", {}), [("ServerMomentum", {"lr": 0.7, "beta": 0.9, "nesterov": True})])),
    "muloco": ({**muon(0.95), "muon.lr": 0.044, "muon.weight_decay": 0.00125, "aux.lr": 4.4e-4,
                "aux.weight_decay": 0.00125}, NONE, KEEP_STATE,  # 2.16: as reported, partly unverified
               (("Mean", {}), [("ServerMomentum", {"lr": 0.9, "beta": 0.8, "nesterov": True})])),
    "fedprox": (sgd(0.3, 1e-3), ("Proximal", {"mu": 1e-3}), RESET, MEAN),  # 2.3 FedPM Table 4: lr 0.3, mu 1e-3
    "scaffold": (sgd(0.1, 1e-3), ("ControlVariate", {}), RESET, MEAN),  # 2.4 FedPAC Table 8
    "fedcm": (sgd(0.1, 1e-3), ("GlobalMix", {"beta": 0.9, "position": "before"}), RESET, MEAN),  # 2.5
    "fedadam": (sgd(0.05, 0.0), NONE, RESET, adaptive("adam")),  # 2.6 client lr 0.05
    "fedyogi": (sgd(0.05, 0.0), NONE, RESET, adaptive("yogi")),
    "fedadagrad": (sgd(0.05, 0.0), NONE, RESET, adaptive("adagrad")),
    "fedlada": ({"optimizer": "AMSGradNoBias", "lr": 3e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-3,
                 "amsgrad": False, "fresh_bias_correction": True},
                ("GlobalMix", {"beta": 0.9, "position": "after"}), AVERAGE, MEAN),  # 2.7, 5.15
    "fedmuon": (muon(0.98), MIX_AFTER, AVERAGE, MEAN),  # 2.8 momentum 0.98
    "fedmuon_svd": (muon(0.98), MIX_AFTER, ("CompressedAverage", {"fraction": 0.05}), MEAN),  # 2.8 c = 0.05
    "fedpac_muon": (muon(0.95), MIX_AFTER, AVERAGE, MEAN),  # 2.9a momentum 0.95
    "fedpac_muon_light": (muon(0.95), MIX_AFTER, ("CompressedAverage", {"fraction": 0.05}), MEAN),  # 2.9d
    "fedpac_soap": (SOAP, MIX_AFTER, AVERAGE, MEAN),  # 2.9b
    "fedpac_soap_light": (SOAP, MIX_AFTER, ("CompressedAverage", {"fraction": 0.1}), MEAN),  # 2.9d c = 0.1
    "fedpac_sophia": (SOPHIA, MIX_AFTER, AVERAGE, MEAN),  # 2.9c wd 0.01 (paper, 5.8)
    "fedpac_sophia_light": (SOPHIA, MIX_AFTER, ("CompressedAverage", {"fraction": 0.05}), MEAN),
    "fedpm": (FOOF, NONE, PERSIST, (("PreconditionedMix", {"mix_lora": False}), [("Step", {"lr": 1.0})])),  # 2.10
    "localnewton": (FOOF, NONE, PERSIST, MEAN),  # 2.11
    "fed_sophia": ({**SOPHIA, "momentum_in_theta": True}, NONE, PERSIST, MEAN),  # 2.12: m and h kept (5.16)
    "fadam_et": (FADAM, ("ParameterTracking", {"position": "after", "tracked_fraction": 0.5}), PERSIST, MEAN),
    "fadam_gt": (FADAM, ("ParameterTracking", {"position": "before", "tracked_fraction": 0.5}), PERSIST, MEAN),
    "prefed": ({"optimizer": "CovarianceAdam", "lr": 1e-3, "betas": (0.9, 0.9), "tau": 1e-3, "weight_decay": 0.0},
               NONE, AVERAGE, MEAN),  # 2.14 (lr 1e-3 resolved)
    "prefedopt": (sgd(0.05, 0.0, momentum=0.9), NONE, RESET,  # 2.14: the paper's FedAvg client, server eta 0.05
                  (("Mean", {}), [("CovarianceServer", {"lr": 0.05, "beta1": 0.9, "beta2": 0.9, "tau": 1e-3})])),
}


def test_every_named_algorithm_has_a_pinned_row():
    assert sorted(EXPECTED) == sorted(list_algorithms())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_defaults_are_the_papers(name):
    optimizer, correction, state_sync, server = EXPECTED[name]
    got = settings(name)
    assert got["optimizer"].keys() == optimizer.keys()
    for key, value in optimizer.items():  # floats to rounding (Muon's lr is 3e-4 x 100), the rest exactly
        assert got["optimizer"][key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key
    assert got["correction"] == correction
    assert got["state_sync"] == state_sync
    assert got["server"] == server
