"""Second-order (preconditioned) algorithms of the seed papers, each a composition of a local optimizer with state
Theta, a state-sync rule, a correction and a server rule (docs/algorithms.md sections 2.1, 2.7-2.14, table 4.3).

"Sends" counts per participating client per round in units of |x| (trainable tensors only); M = entries of the
Muon momentum (>= 2-D tensors), LR = entries of SOAP's factors, FA = entries of FOOF's covariances. The trainer's
``uplink_MB``/``downlink_MB`` report the bytes actually sent.
"""

from __future__ import annotations

from typing import Tuple

from .compose import ALGORITHMS, Algorithm
from ..corrections import GlobalMix, ParameterTracking
from ..optim import LocalOptimizer
from ..server import CovarianceServer, Mean, PreconditionedMix, ServerRule, Step
from ..sync import AverageWarmstart, CompressedAverage, PersistLocal, StateSync


def _muon(lr: float, muon_lr_mult: float, momentum: float, weight_decay: float, routing: str,
          **form) -> LocalOptimizer:
    """``form``: FedMuon's optional ``momentum_form`` / ``ortho`` / ``nesterov`` (fedhf.optim.muon_exact)."""
    return LocalOptimizer("muon", {"lr": lr, "muon_lr_mult": muon_lr_mult, "momentum": momentum,
                                   "weight_decay": weight_decay, "routing": routing, **form})


def _soap(lr: float, weight_decay: float, betas: Tuple[float, float], precondition_frequency: int) -> LocalOptimizer:
    return LocalOptimizer("soap", {"lr": lr, "weight_decay": weight_decay, "betas": tuple(betas),
                                   "shampoo_beta": betas[1], "precondition_frequency": precondition_frequency})


def _sophia(lr: float, weight_decay: float, rho: float, betas: Tuple[float, float], hessian_estimator: str,
            hess_interval: int, momentum_in_theta: bool = False) -> LocalOptimizer:
    return LocalOptimizer("sophia", {"lr": lr, "weight_decay": weight_decay, "rho": rho, "betas": tuple(betas),
                                     "hessian_estimator": hessian_estimator, "hess_interval": hess_interval,
                                     "momentum_in_theta": momentum_in_theta})


def _foof(lr: float, damping: float, weight_decay: float, curvature_samples) -> LocalOptimizer:
    return LocalOptimizer("foof", {"lr": lr, "damping": damping, "weight_decay": weight_decay,
                                   "curvature_samples": curvature_samples})


def _aligned(light: bool, fraction: float) -> StateSync:
    return CompressedAverage(fraction) if light else AverageWarmstart()


# ---------------------------------------------------------------- Local X (state reset every round)
@ALGORITHMS.register("local_soap")
def local_soap(lr: float = 3e-3, weight_decay: float = 0.01, betas=(0.95, 0.95),
               precondition_frequency: int = 10) -> Algorithm:
    """Local SOAP (FedPAC Alg. 1, Table 8; SOAP: Vyas et al., 2024). State reset every round, so the first local
    step of a round only builds the eigenbasis. Sends Delta up, x down (1 | 1)."""
    return Algorithm("local_soap", _soap(lr, weight_decay, betas, precondition_frequency))


@ALGORITHMS.register("local_sophia")
def local_sophia(lr: float = 3e-4, weight_decay: float = 0.01, rho: float = 0.01, betas=(0.9, 0.99),
                 hessian_estimator: str = "gnb", hess_interval: int = 10) -> Algorithm:
    """Local Sophia (FedPAC Alg. 1, Table 8; Sophia: Liu et al., 2023). h refreshed every ``hess_interval`` local
    steps with the chosen estimator (GNB by default; the FedPAC code uses empirical Fisher every step:
    ``hessian_estimator="empirical_fisher", hess_interval=1``). Sends 1 | 1."""
    return Algorithm("local_sophia", _sophia(lr, weight_decay, rho, betas, hessian_estimator, hess_interval))


# ---------------------------------------------------------------- FedMuon / FedPAC (alignment + correction)
@ALGORITHMS.register("fedmuon")
def fedmuon(lr: float = 3e-4, muon_lr_mult: float = 100.0, momentum: float = 0.98, beta: float = 0.5,
            weight_decay: float = 0.01, routing: str = "ndim>=2", momentum_form: str = "ema", ortho: str = "ns5",
            nesterov: bool = True) -> Algorithm:
    """FedMuon (Liu et al., 2025, "FedMuon: Accelerating Federated Learning with Matrix Orthogonalization"): local
    Muon whose momentum starts from the average of last round's final client momenta, and global-direction mixing
    x <- x - eta [(1 - beta) Muon(g) + beta g_G] after the optimizer (the paper's alpha; beta here as in every
    mixing algorithm, docs/algorithms.md section 5.3). Defaults: beta 0.5, momentum 0.98
    (Table 6), wd 0.01; Muon lr = lr * muon_lr_mult = 3e-2. Sends Delta + M up (~2), x + g_G + Mbar down (~3).

    The local Muon is the authors' code's (Keller Jordan's EMA momentum with Nesterov, Newton-Schulz 5). The paper's
    Algorithm 1 (M <- beta M + G, exact U V^T of the SVD, no Nesterov) is ``momentum_form="sum", ortho="svd",
    nesterov=False`` (docs/algorithms.md 5.4); its averaged momentum is then the sum-form buffer, 1 / (1 - momentum)
    times the EMA one, and the steps match the EMA form without Nesterov (fedhf.optim.muon_exact)."""
    form = {"momentum_form": momentum_form, "ortho": ortho, "nesterov": nesterov}
    return Algorithm("fedmuon", _muon(lr, muon_lr_mult, momentum, weight_decay, routing, **form),
                     correction=GlobalMix(beta, position="after"), state_sync=AverageWarmstart())


@ALGORITHMS.register("fedmuon_svd")
def fedmuon_svd(lr: float = 3e-4, muon_lr_mult: float = 100.0, momentum: float = 0.98, beta: float = 0.5,
                weight_decay: float = 0.01, routing: str = "ndim>=2", fraction: float = 0.05) -> Algorithm:
    """FedMuon_SVD (Liu et al., 2025): FedMuon with each momentum matrix uploaded as a truncated SVD of about
    ``fraction`` of its size (rank rule of docs/algorithms.md 2.8). Sends Delta + 0.05 M up, x + g_G + Mbar down."""
    return Algorithm("fedmuon_svd", _muon(lr, muon_lr_mult, momentum, weight_decay, routing),
                     correction=GlobalMix(beta, position="after"), state_sync=CompressedAverage(fraction))


def _fedpac_muon(name, light, lr, muon_lr_mult, momentum, beta, weight_decay, routing, fraction):
    return Algorithm(name, _muon(lr, muon_lr_mult, momentum, weight_decay, routing),
                     correction=GlobalMix(beta, position="after"), state_sync=_aligned(light, fraction))


@ALGORITHMS.register("fedpac_muon")
def fedpac_muon(lr: float = 3e-4, muon_lr_mult: float = 100.0, momentum: float = 0.95, beta: float = 0.5,
                weight_decay: float = 0.01, routing: str = "ndim>=2") -> Algorithm:
    """FedPAC_Muon (Liu et al., "Taming Preconditioner Drift: Unlocking the Potential of Second-Order Optimizers
    for Federated Learning on Non-IID Data", Alg. 2): alignment of the Muon momentum (averaged, warm-started) and
    correction (global-direction mixing, beta 0.5). Muon momentum 0.95 (FedPAC code). Sends 1 + M | 2 + M."""
    return _fedpac_muon("fedpac_muon", False, lr, muon_lr_mult, momentum, beta, weight_decay, routing, None)


@ALGORITHMS.register("fedpac_muon_light")
def fedpac_muon_light(lr: float = 3e-4, muon_lr_mult: float = 100.0, momentum: float = 0.95, beta: float = 0.5,
                      weight_decay: float = 0.01, routing: str = "ndim>=2", fraction: float = 0.05) -> Algorithm:
    """FedPAC_Muon_light (FedPAC Table 6/11): the momentum uploaded as a rank-r SVD, c = 0.05. Sends 1 + 0.05 M |
    2 + M."""
    return _fedpac_muon("fedpac_muon_light", True, lr, muon_lr_mult, momentum, beta, weight_decay, routing, fraction)


def _fedpac_soap(name, light, lr, weight_decay, betas, precondition_frequency, beta, fraction):
    return Algorithm(name, _soap(lr, weight_decay, betas, precondition_frequency),
                     correction=GlobalMix(beta, position="after"), state_sync=_aligned(light, fraction))


@ALGORITHMS.register("fedpac_soap")
def fedpac_soap(lr: float = 3e-3, weight_decay: float = 0.01, betas=(0.95, 0.95), precondition_frequency: int = 10,
                beta: float = 0.5) -> Algorithm:
    """FedPAC_SOAP (FedPAC Alg. 2 with SOAP): the factors L, R averaged and warm-started (the eigenbasis and Adam
    moments restart: the first local step builds the eigenbasis from Lbar, Rbar and the first gradient), plus
    global-direction mixing. Defaults: FedPAC Table 8. Sends 1 + LR | 2 + LR. SOAP runs in the authors' code order
    (factors updated after the step, sorted eigenbasis refresh); ``local_optimizer_kwargs`` ``factor_update="before"``
    / ``eigenbasis_refresh="power_qr"`` select the other orders (fedhf.optim.soap)."""
    return _fedpac_soap("fedpac_soap", False, lr, weight_decay, betas, precondition_frequency, beta, None)


@ALGORITHMS.register("fedpac_soap_light")
def fedpac_soap_light(lr: float = 3e-3, weight_decay: float = 0.01, betas=(0.95, 0.95),
                      precondition_frequency: int = 10, beta: float = 0.5, fraction: float = 0.1) -> Algorithm:
    """FedPAC_SOAP_light (FedPAC Table 6/11): L, R uploaded as truncated eigendecompositions, c = 0.1. Sends
    1 + 0.1 LR | 2 + LR."""
    return _fedpac_soap("fedpac_soap_light", True, lr, weight_decay, betas, precondition_frequency, beta, fraction)


def _fedpac_sophia(name, light, lr, weight_decay, rho, betas, hessian_estimator, hess_interval, beta, fraction):
    return Algorithm(name, _sophia(lr, weight_decay, rho, betas, hessian_estimator, hess_interval),
                     correction=GlobalMix(beta, position="after"), state_sync=_aligned(light, fraction))


@ALGORITHMS.register("fedpac_sophia")
def fedpac_sophia(lr: float = 3e-4, weight_decay: float = 0.01, rho: float = 0.01, betas=(0.9, 0.99),
                  hessian_estimator: str = "gnb", hess_interval: int = 10, beta: float = 0.5) -> Algorithm:
    """FedPAC_Sophia (FedPAC Alg. 9): h averaged and warm-started, refreshed locally (the reference code never
    refreshes it, so its h stays 0 -- not copied, docs/algorithms.md 5.7), m reset, global-direction mixing.
    wd 0.01 (paper; code 0.1). Sends 2 | 3."""
    return _fedpac_sophia("fedpac_sophia", False, lr, weight_decay, rho, betas, hessian_estimator, hess_interval,
                          beta, None)


@ALGORITHMS.register("fedpac_sophia_light")
def fedpac_sophia_light(lr: float = 3e-4, weight_decay: float = 0.01, rho: float = 0.01, betas=(0.9, 0.99),
                        hessian_estimator: str = "gnb", hess_interval: int = 10, beta: float = 0.5,
                        fraction: float = 0.05) -> Algorithm:
    """FedPAC_Sophia_light (FedPAC Table 6/11): h of matrices uploaded low-rank (c = 0.05, clamped >= 0), 1-D h
    dense. Sends 1 + 0.05 | 3."""
    return _fedpac_sophia("fedpac_sophia_light", True, lr, weight_decay, rho, betas, hessian_estimator,
                          hess_interval, beta, fraction)


@ALGORITHMS.register("fedlada")
def fedlada(lr: float = 3e-4, weight_decay: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
            beta: float = 0.9) -> Algorithm:
    """FedLADA (Sun et al., 2023, "Efficient Federated Learning via Local Adaptive Amended Optimizer with Linear
    Speedup"), as the baseline implemented by the FedAdamW code: Adam (coupled wd 1e-3), v averaged and
    warm-started, m reset, global-direction mixing with weight 0.9 after preconditioning. As in that code, Adam's
    bias correction is on while a client has no carried v (round one: ordinary Adam from zero moments) and off
    once v is warm-started (``fresh_bias_correction``, :class:`fedhf.optim.amsgrad.AMSGradNoBias`).
    Sends 2 (Delta, v) | 3 (x, g_G, vbar)."""
    opt = LocalOptimizer("amsgrad", {"lr": lr, "weight_decay": weight_decay, "betas": tuple(betas), "eps": eps,
                                     "amsgrad": False, "fresh_bias_correction": True})
    return Algorithm("fedlada", opt, correction=GlobalMix(beta, position="after"), state_sync=AverageWarmstart())


# ---------------------------------------------------------------- FedPM / LocalNewton (FOOF curvature)
@ALGORITHMS.register("fedpm")
def fedpm(lr: float = 0.3, damping: float = 1.0, weight_decay: float = 1e-4, curvature_samples=None,
          mix_lora: bool = False) -> Algorithm:
    """FedPM (Ishii et al., AAAI 2026, "Preconditioned Mixing for Federated Second-Order Optimization"): local
    FOOF-preconditioned SGD with each client's input covariances A_i (computed at the end of its round on its data
    and cached for its next one), and preconditioned mixing on the server,
    W <- W + [sum_i Delta_i (A_i + lambda I)] [sum_j (A_j + lambda I)]^{-1} per linear layer (equations re-derived,
    docs/algorithms.md 2.10). LoRA tensors are averaged unless ``mix_lora`` (docs/algorithms.md 6: not evaluated in the
    paper). Defaults: FedPM Table 4, except clipping: Table 4 clips nothing, while fedhf leaves clipping to the
    Trainer's ``max_grad_norm`` (default 1.0) for every algorithm; ``max_grad_norm=0`` is the paper's setting
    (recipes/fedpm_table3_*.yaml). Sends 1 + FA | 1 (FA without the LoRA layers unless ``mix_lora``)."""
    return Algorithm("fedpm", _foof(lr, damping, weight_decay, curvature_samples), state_sync=PersistLocal(),
                     server_rule=ServerRule(PreconditionedMix(mix_lora=mix_lora), [Step()]))


@ALGORITHMS.register("localnewton")
def localnewton(lr: float = 0.3, damping: float = 1.0, weight_decay: float = 1e-4, curvature_samples=None) -> Algorithm:
    """LocalNewton (Gupta et al., 2021), as FedPM's baseline: FedPM's client (FOOF-preconditioned SGD, cached
    covariances) with plain averaging; the covariances never leave the client. Sends 1 | 1."""
    return Algorithm("localnewton", _foof(lr, damping, weight_decay, curvature_samples), state_sync=PersistLocal())


# ---------------------------------------------------------------- Fed-Sophia, FAdam, PreFed
@ALGORITHMS.register("fed_sophia")
def fed_sophia(lr: float = 3e-4, weight_decay: float = 0.01, rho: float = 0.01, betas=(0.9, 0.99),
               hessian_estimator: str = "gnb", hess_interval: int = 10, keep_momentum: bool = True) -> Algorithm:
    """Fed-Sophia (Elbakary et al., 2024, arXiv 2406.06655): local SophiaG whose state -- the momentum m and the
    Hessian estimate h -- persists per client across its participations (docs/algorithms.md 2.12, 5.16: the paper indexes
    m_t, h_t by a global step and never resets them), plain averaging. ``keep_momentum=False`` keeps h only and
    restarts m every round (fedhf's earlier behaviour, kept for old runs). Defaults: Local Sophia's (the seeds give
    none). Sends 1 | 1 (the state never leaves the client)."""
    return Algorithm("fed_sophia", _sophia(lr, weight_decay, rho, betas, hessian_estimator, hess_interval,
                                           momentum_in_theta=keep_momentum),
                     state_sync=PersistLocal())


def _fadam(name: str, position: str, lr, weight_decay, betas, eps, tracked_fraction, server_lr) -> Algorithm:
    opt = LocalOptimizer("amsgrad", {"lr": lr, "weight_decay": weight_decay, "betas": tuple(betas), "eps": eps})
    return Algorithm(name, opt, correction=ParameterTracking(position, tracked_fraction), state_sync=PersistLocal(),
                     server_rule=ServerRule(Mean(), [Step(server_lr)]))


@ALGORITHMS.register("fadam_et")
def fadam_et(lr: float = 1e-3, weight_decay: float = 1e-8, betas=(0.9, 0.99), eps: float = 1e-8,
             tracked_fraction: float = 0.5, server_lr: float = 1.0) -> Algorithm:
    """FAdamET (Chen et al., 2025, "Parameter Tracking in Federated Learning with Adaptive Optimization"): local
    AMSGrad without bias correction, v_hat kept per client, tracking term y - y_i added after preconditioning;
    half the round's clients refresh y_i. Defaults: sec. 6.1. Sends 1 (+1 if tracked) | 2."""
    return _fadam("fadam_et", "after", lr, weight_decay, betas, eps, tracked_fraction, server_lr)


@ALGORITHMS.register("fadam_gt")
def fadam_gt(lr: float = 1e-3, weight_decay: float = 1e-8, betas=(0.9, 0.99), eps: float = 1e-8,
             tracked_fraction: float = 0.5, server_lr: float = 1.0) -> Algorithm:
    """FAdamGT (Chen et al., 2025): as FAdamET but the tracking term corrects the gradient before the moments and
    y_i+ is the mean raw gradient. Sends 1 (+1 if tracked) | 2."""
    return _fadam("fadam_gt", "before", lr, weight_decay, betas, eps, tracked_fraction, server_lr)


@ALGORITHMS.register("prefed")
def prefed(lr: float = 1e-3, betas=(0.9, 0.9), tau: float = 1e-3, weight_decay: float = 0.0) -> Algorithm:
    """PreFed (Tao et al., AISTATS 2022, "Preconditioned Federated Optimization", Alg. 2): local covariance
    ("SDProp") optimizer whose preconditioner P is averaged and warm-started; momentum restarts each round
    (docs/algorithms.md 5.12). Sends 2 | 2."""
    opt = LocalOptimizer("covariance_adam", {"lr": lr, "betas": tuple(betas), "tau": tau,
                                             "weight_decay": weight_decay})
    return Algorithm("prefed", opt, state_sync=AverageWarmstart())


@ALGORITHMS.register("prefedopt")
def prefedopt(lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 0.0, server_lr: float = 0.05,
              beta1: float = 0.9, beta2: float = 0.9, tau: float = 1e-3) -> Algorithm:
    """PreFedOpt (Tao et al., AISTATS 2022, Alg. 3): local SGD (momentum 0.9, lr 0.05 as the paper's FedAvg
    baseline, sec. 6), the covariance preconditioner on the server: x <- x + eta_g D / sqrt(P + tau) with D the
    per-step mean update (sign and momentum typos fixed, docs/algorithms.md 5.12). Alg. 3's client is plain SGD:
    ``momentum=0`` (the momentum buffer restarts every round either way). Sends 1 | 1."""
    opt = LocalOptimizer("sgd", {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
    return Algorithm("prefedopt", opt, server_rule=ServerRule(Mean(), [CovarianceServer(server_lr, beta1, beta2, tau)]))
