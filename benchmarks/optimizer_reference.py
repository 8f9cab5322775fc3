"""Each fedhf optimizer's step against a public implementation of the same optimizer.

References (benchmark dependencies, never test dependencies): ``torch.optim.Muon`` (torch 2.13) and
pytorch-optimizer 3.11.0's ``SOAP`` and ``SophiaH`` (``make benchmarks`` installs it with ``--no-deps``).

Both optimizers get the same parameter set (a copy each) and the same gradients (real gradients of the tiny Llama,
recorded once), stepping in turn, the order alternating per step. Reported per optimizer and setup: ms per step
of each (median over steps; SOAP's with its refresh every 10 updates charged once per 10), the ratio, and the
max |difference| of the parameters after the same steps where the math is the same. What differs, and how the
settings are aligned (each also in the printed notes):

* Muon: fedhf's ``muon`` is ``torch.optim.Muon`` on the matrices (lr x ``muon_lr_mult``) + ``torch.optim.AdamW``
  on the rest, so the reference is exactly that pair; ``newton_schulz="batched"`` is fedhf's cheaper variant
  (fedhf/optim/muon_batched.py), a few bfloat16 ulps from torch's numbers on CPU; ``newton_schulz="gram"``
  (fedhf/optim/gram_newton_schulz.py) iterates in float32, so it differs from torch by torch's own bfloat16 error.
* SOAP: the same algorithm (Vyas et al. 2024, the authors' update order: factors absorb G after the step, sorted
  power-QR refresh), but pytorch-optimizer counts its init call as step 1, so its first real update uses bias
  correction t = 2 (fedhf: t = 1) and it refreshes after its 9th real update (fedhf: after the 10th); it also
  keeps m in the original basis and projects it every step (fedhf keeps it rotated and re-projects only when the
  basis changes; equal in exact arithmetic). The numbers check therefore runs 1 init + 5 updates with
  ``correct_bias=False`` (no refresh yet); the timing uses the defaults.
* Sophia: fedhf's default estimator is SophiaG's (GNB); SophiaH is the Hutchinson form, so the comparison uses
  ``hessian_estimator="hutchinson"``. SophiaH writes p <- p - lr' clip(m / max(h, eps), p'), fedhf
  p <- p - lr clip(m / (rho h + eps), 1) (bs = 1 for Hutchinson): equal with lr' = lr / rho, p' = rho,
  weight_decay' = weight_decay * rho. The update check starts both from the same h and steps without refresh;
  the estimator check compares fedhf's ``hutchinson_estimate`` with SophiaH's ``compute_hutchinson_hessian`` on
  the same Rademacher draws (fedhf then clamps the estimate at 0, FedPAC Alg. 8/9; SophiaH does not, and its
  step-counter only folds a new estimate into h at steps 20, 30, ...: the timing passes h in explicitly).
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Callable, Dict, List

import torch

from fedhf.optim import MuonAdamW, Sophia
from fedhf.optim import SOAP as FedSOAP
from fedhf.optim.muon import route_to_muon
from fedhf.optim.sophia import hutchinson_estimate

Grads = List[Dict[str, torch.Tensor]]
MUON = dict(lr=3e-4, muon_lr_mult=100.0, momentum=0.95, weight_decay=0.01)
SOPHIA = dict(lr=1e-4, betas=(0.965, 0.99), rho=0.04, weight_decay=0.1)


def reference_module():
    try:
        import pytorch_optimizer
    except ImportError:
        raise SystemExit("optimizer_cost.py needs pytorch-optimizer as its SOAP/SophiaH reference: "
                         "`pip install --no-deps pytorch-optimizer==3.11.0` (make benchmarks does this).") from None
    return pytorch_optimizer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def record_gradients(model: torch.nn.Module, batches: List[dict]) -> Grads:
    """The trainable parameters' gradients on each batch, at the model's initial weights."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    out = []
    for batch in batches:
        grads = torch.autograd.grad(model(**batch).loss, list(params.values()))
        out.append({n: g.detach().clone() for n, g in zip(params, grads)})
    return out


def fresh_params(model: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
    return {n: torch.nn.Parameter(p.detach().clone()) for n, p in model.named_parameters() if p.requires_grad}


def race(ours: Callable[[], None], reference: Callable[[], None], set_grads: Callable[[int], None], calls: int,
         device: torch.device) -> tuple[List[float], List[float]]:
    """Step both ``calls`` times on the same gradients, alternating who goes first; seconds per call of each."""
    times: Dict[str, List[float]] = {"ours": [], "ref": []}
    for t in range(calls):
        pair = [("ours", ours), ("ref", reference)]
        for key, step in (pair if t % 2 == 0 else pair[::-1]):
            set_grads(t)
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            times[key].append(time.perf_counter() - start)
    return times["ours"], times["ref"]


def max_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    return max(float((a[n].detach() - b[n].detach()).abs().max()) for n in a)


def assign(params: Dict[str, torch.nn.Parameter], grads: Dict[str, torch.Tensor]) -> None:
    for n, p in params.items():
        p.grad = grads[n].clone()


def per_period(seconds: List[float], period: int) -> float:
    """Mean over a period's positions of each position's median over periods (a refresh charged once a period)."""
    periods = max(1, len(seconds) // period)
    return sum(statistics.median(seconds[j:periods * period:period]) for j in range(period)) / period


def muon_case(model: torch.nn.Module, grads: Grads, device: torch.device, newton_schulz: str) -> dict:
    ours_p, ref_p = fresh_params(model), fresh_params(model)
    ours = MuonAdamW(list(ours_p.items()), newton_schulz=newton_schulz, **MUON)
    matrices = [p for n, p in ref_p.items() if route_to_muon(n, p, "ndim>=2")]
    rest = [p for n, p in ref_p.items() if not route_to_muon(n, p, "ndim>=2")]
    muon = torch.optim.Muon(matrices, lr=MUON["lr"] * MUON["muon_lr_mult"], momentum=MUON["momentum"],
                            weight_decay=MUON["weight_decay"])
    adamw = torch.optim.AdamW(rest, lr=MUON["lr"], betas=(0.9, 0.95), eps=1e-10,
                              weight_decay=MUON["weight_decay"]) if rest else None  # LoRA: matrices only

    def reference() -> None:
        muon.step()
        if adamw is not None:
            adamw.step()

    def set_grads(t: int) -> None:
        assign(ours_p, grads[t % len(grads)])
        assign(ref_p, grads[t % len(grads)])

    mine, theirs = race(ours.step, reference, set_grads, len(grads), device)
    return {"ours": statistics.median(mine[1:]), "ref": statistics.median(theirs[1:]), "diff": max_diff(ours_p, ref_p),
            "steps": len(grads)}


def soap_case(model: torch.nn.Module, grads: Grads, device: torch.device, period: int = 10) -> dict:
    SOAP = reference_module().SOAP

    def pair(**kwargs):
        ours_p, ref_p = fresh_params(model), fresh_params(model)
        return (ours_p, FedSOAP(list(ours_p.items()), **kwargs), ref_p,
                SOAP(list(ref_p.values()), max_precondition_dim=10000, **kwargs))

    ours_p, ours, ref_p, ref = pair(correct_bias=False)  # the numbers: init + 5 updates, no refresh yet
    for t in range(6):
        assign(ours_p, grads[t % len(grads)])
        assign(ref_p, grads[t % len(grads)])
        ours.step()
        ref.step()
    diff = max_diff(ours_p, ref_p)
    ours_p, ours, ref_p, ref = pair()  # the timing: defaults, init call untimed, then whole refresh periods

    def set_grads(t: int) -> None:
        assign(ours_p, grads[t % len(grads)])
        assign(ref_p, grads[t % len(grads)])

    calls = 1 + period * max(1, (len(grads) - 1) // period)
    mine, theirs = race(ours.step, ref.step, set_grads, calls, device)
    return {"ours": per_period(mine[1:], period), "ref": per_period(theirs[1:], period), "diff": diff,
            "steps": calls - 1}


def sophia_case(model: torch.nn.Module, grads: Grads, device: torch.device) -> dict:
    SophiaH = reference_module().SophiaH
    rho = SOPHIA["rho"]
    ours_p, ref_p = fresh_params(model), fresh_params(model)
    ours = Sophia(list(ours_p.items()), hessian_estimator="hutchinson", hess_interval=10 ** 9, **SOPHIA)
    ref = SophiaH(list(ref_p.values()), lr=SOPHIA["lr"] / rho, betas=SOPHIA["betas"], p=rho, eps=1e-15,
                  weight_decay=SOPHIA["weight_decay"] * rho, update_period=10 ** 9, hessian_distribution="rademacher")
    torch.manual_seed(0)
    h = {n: torch.rand_like(p) * 1e-3 for n, p in ours_p.items()}  # one shared curvature state, no refresh
    ours.import_theta({f"hessian:{n}": v for n, v in h.items()})
    for n, p in ref_p.items():
        ref.state[p].update(momentum=torch.zeros_like(p), hessian_moment=h[n].clone())

    def set_grads(t: int) -> None:
        assign(ours_p, grads[t % len(grads)])
        assign(ref_p, grads[t % len(grads)])

    mine, theirs = race(ours.step, ref.step, set_grads, len(grads), device)
    return {"ours": statistics.median(mine[1:]), "ref": statistics.median(theirs[1:]), "diff": max_diff(ours_p, ref_p),
            "steps": len(grads)}


def hutchinson_check(model: torch.nn.Module, batch: dict) -> float:
    """Max |fedhf's u * (H u) - SophiaH's| on one batch with the same Rademacher draws (before fedhf's clamp)."""
    reference_module()
    from pytorch_optimizer.base.optimizer import BaseOptimizer as base
    params = [p for p in model.parameters() if p.requires_grad]
    torch.manual_seed(7)
    ours = hutchinson_estimate(model(**batch).loss, params)
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward(create_graph=True)
    state = {p: {"hessian": torch.zeros_like(p)} for p in params}
    torch.manual_seed(7)
    base.compute_hutchinson_hessian([{"params": params}], state, distribution="rademacher")
    model.zero_grad(set_to_none=True)
    return max(float((o - state[p]["hessian"]).abs().max()) for o, p in zip(ours, params))


def compare_with_references(models: Dict[str, torch.nn.Module], batches: List[dict], steps: int,
                            device: torch.device) -> Dict[str, Dict[str, dict]]:
    """Per setup (lora, full): muon, muon[batched], muon[gram], soap, sophia results; plus the Hutchinson check on
    LoRA."""
    out: Dict[str, Dict[str, dict]] = {}
    for setup, model in models.items():
        grads = record_gradients(model, batches)
        many = (grads * (-(-(1 + steps) // len(grads))))[:1 + steps]  # gradients cycle
        out[setup] = {"muon": muon_case(model, many[:6], device, "torch"),
                      "muon[batched]": muon_case(model, many[:6], device, "batched"),
                      "muon[gram]": muon_case(model, many[:6], device, "gram"),
                      "soap": soap_case(model, many, device),
                      "sophia": sophia_case(model, many[:11], device)}
        print(f"  6a {setup}: " + ", ".join(f"{k} {v['ours'] * 1e3:.1f}/{v['ref'] * 1e3:.1f} ms"
                                             for k, v in out[setup].items()), flush=True)
    eager = copy.deepcopy(models["lora"])
    eager.get_base_model().set_attn_implementation("eager")  # SDPA on CPU has no double backward
    out["lora"]["sophia"]["hutchinson_diff"] = hutchinson_check(eager, batches[0])
    return out
