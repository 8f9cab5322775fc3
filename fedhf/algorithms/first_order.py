"""First-order algorithms: FedAvg, FedAvgM, FedProx, SCAFFOLD, FedCM, FedOpt, DES-LOC, and the Local AdamW / Local
Muon baselines (each a composition of one option per axis; see :mod:`fedhf.algorithm`)."""

from __future__ import annotations

from .compose import ALGORITHMS, Algorithm
from ..corrections import ControlVariate, GlobalMix, Proximal
from ..optim import LocalOptimizer
from ..server import AdaptiveServer, Mean, ServerMomentum, ServerRule, Step
from ..sync import DesLoc


def _sgd(lr: float, weight_decay: float, momentum: float = 0.0) -> LocalOptimizer:
    return LocalOptimizer("sgd", {"lr": lr, "weight_decay": weight_decay, "momentum": momentum})


@ALGORITHMS.register("fedavg")
def fedavg(lr: float = 0.1, weight_decay: float = 1e-3, momentum: float = 0.0, server_lr: float = 1.0) -> Algorithm:
    """FedAvg / Local SGD (McMahan et al., 2017). Sends Delta (|x|) up, x (|x|) down.
    Defaults: FedPAC Table 8 (lr 0.1, wd 1e-3, no momentum)."""
    return Algorithm("fedavg", _sgd(lr, weight_decay, momentum), server_rule=ServerRule(Mean(), [Step(server_lr)]))


@ALGORITHMS.register("local_adamw")
def local_adamw(lr: float = 3e-4, weight_decay: float = 0.01, betas=(0.9, 0.999), eps: float = 1e-8) -> Algorithm:
    """Local AdamW, state reset every round (FedPAC Alg. 1, Table 8). Sends Delta up, x down (|x| each)."""
    opt = LocalOptimizer("adamw", {"lr": lr, "weight_decay": weight_decay, "betas": tuple(betas), "eps": eps})
    return Algorithm("local_adamw", opt)


@ALGORITHMS.register("desloc")
def desloc(lr: float = 3e-4, weight_decay: float = 0.01, betas=(0.9, 0.999), eps: float = 1e-8,
           first_moment_period: int = 3, second_moment_period: int = 6) -> Algorithm:
    """DES-LOC (Iacob et al., 2025, "DES-LOC: Desynced Low Communication Adaptive Optimizers for Training Foundation
    Models", arXiv 2505.22549): local AdamW whose whole state each client keeps; the parameters are averaged every
    round, the first moment every ``first_moment_period`` rounds and the second every ``second_moment_period``
    (:class:`fedhf.sync.DesLoc`; 3 and 6, the paper's recommended K_u = 3 K_x, K_v = 6 K_x). With both periods 1 it
    is Local Adam (every state averaged every round). AdamW settings: Local AdamW's. Sends Delta (+ the moments due)
    up, x (+ their averages) down."""
    opt = LocalOptimizer("adamw", {"lr": lr, "weight_decay": weight_decay, "betas": tuple(betas), "eps": eps})
    return Algorithm("desloc", opt, state_sync=DesLoc(first_moment_period, second_moment_period))


@ALGORITHMS.register("local_muon")
def local_muon(lr: float = 3e-4, muon_lr_mult: float = 100.0, momentum: float = 0.95, weight_decay: float = 0.01,
               routing: str = "ndim>=2") -> Algorithm:
    """Local Muon, state reset every round (FedPAC Alg. 1 / FedMuon baseline): torch.optim.Muon on matrices
    (LoRA A and B separately), AdamW (betas 0.9/0.95) on the rest. Sends Delta up, x down (|x| each).
    Defaults: FedPAC Table 8 (Muon momentum 0.95, wd 0.01); Muon lr = lr * muon_lr_mult = 3e-2 as in its
    "Local Muon: lr 3e-2", aux AdamW lr 3e-4 (Keller Jordan's default)."""
    opt = LocalOptimizer("muon", {"lr": lr, "muon_lr_mult": muon_lr_mult, "momentum": momentum,
                                  "weight_decay": weight_decay, "routing": routing})
    return Algorithm("local_muon", opt)


@ALGORITHMS.register("fedavgm")
def fedavgm(lr: float = 0.1, weight_decay: float = 1e-4, server_lr: float = 1.0, server_momentum: float = 0.9) -> Algorithm:
    """FedAvgM, server momentum (Hsu et al., 2019). Sends |x| each way. Defaults: FedPM Table 4."""
    return Algorithm("fedavgm", _sgd(lr, weight_decay),
                     server_rule=ServerRule(Mean(), [ServerMomentum(server_lr, server_momentum)]))


@ALGORITHMS.register("fedprox")
def fedprox(lr: float = 0.3, weight_decay: float = 1e-3, mu: float = 1e-3) -> Algorithm:
    """FedProx (Li et al., 2020): proximal term mu/2 ||x - x^r||^2. Sends |x| each way. lr 0.3 and mu 1e-3 from
    FedPM Table 4 (docs/algorithms.md 2.3; that table puts mu in its weight-decay column, so wd keeps FedAvg's 1e-3)."""
    return Algorithm("fedprox", _sgd(lr, weight_decay), correction=Proximal(mu))


@ALGORITHMS.register("scaffold")
def scaffold(lr: float = 0.1, weight_decay: float = 1e-3, server_lr: float = 1.0) -> Algorithm:
    """SCAFFOLD option II (Karimireddy et al., 2020). Sends Delta and Delta_c up, x and c down (2|x| each).
    Client variates c_i persist per client id. Defaults: FedPAC Table 8."""
    return Algorithm("scaffold", _sgd(lr, weight_decay), correction=ControlVariate(),
                     server_rule=ServerRule(Mean(), [Step(server_lr)]))


@ALGORITHMS.register("fedcm")
def fedcm(lr: float = 0.1, weight_decay: float = 1e-3, beta: float = 0.9) -> Algorithm:
    """FedCM, client-level momentum (Xu et al., 2021): d = (1 - beta) g + beta g_G. Sends Delta up (|x|),
    x and g_G down (2|x|). Defaults: FedPAC Table 8 (beta 0.9)."""
    return Algorithm("fedcm", _sgd(lr, weight_decay), correction=GlobalMix(beta, position="before"))


def _fedopt(kind: str, lr: float, weight_decay: float, server_lr: float, beta1: float, beta2: float, tau: float):
    return Algorithm(f"fed{kind}", _sgd(lr, weight_decay),
                     server_rule=ServerRule(Mean(), [AdaptiveServer(kind, lr=server_lr, beta1=beta1, beta2=beta2,
                                                                    tau=tau)]))


@ALGORITHMS.register("fedadam")
def fedadam(lr: float = 0.05, weight_decay: float = 0.0, server_lr: float = 0.03,
            beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> Algorithm:
    """FedAdam (Reddi et al., 2021): Local SGD, Adam on the server. |x| each way. Defaults: FedPM Table 4."""
    return _fedopt("adam", lr, weight_decay, server_lr, beta1, beta2, tau)


@ALGORITHMS.register("fedyogi")
def fedyogi(lr: float = 0.05, weight_decay: float = 0.0, server_lr: float = 0.03,
            beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> Algorithm:
    """FedYogi (Reddi et al., 2021): Local SGD, Yogi on the server. |x| each way."""
    return _fedopt("yogi", lr, weight_decay, server_lr, beta1, beta2, tau)


@ALGORITHMS.register("fedadagrad")
def fedadagrad(lr: float = 0.05, weight_decay: float = 0.0, server_lr: float = 0.03,
               beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> Algorithm:
    """FedAdagrad (Reddi et al., 2021): Local SGD, Adagrad on the server. |x| each way."""
    return _fedopt("adagrad", lr, weight_decay, server_lr, beta1, beta2, tau)
