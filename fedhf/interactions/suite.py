"""Run pairs of the matrix and judge them: every distinct configuration once (pairs share their twins), 1-process
ones in this process, 2-process ones in as few torchrun launches as possible (one, plus one more after each
configuration that crashes a launch)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, List, Optional

import torch

from .execute import execute
from .features import MUST_REFUSE, Feature
from .matrix import EQUAL, REFUSED, STATISTICAL, TRAINS, Pair, configuration, lookup
from .oracles import PROPERTIES, equal, refusal_ok, trains


@dataclass
class Verdict:
    name: str
    oracle: str  # refused / equal / statistical / trains (what the pair turned out to carry)
    problem: Optional[str] = None  # None: the invariant holds


@dataclass
class Report:
    verdicts: List[Verdict] = field(default_factory=list)
    alone: List[Verdict] = field(default_factory=list)
    seconds: float = 0.0
    launches: int = 0

    def count(self, oracle: str) -> int:
        return sum(v.oracle == oracle for v in self.verdicts)

    @property
    def failing(self) -> List[Verdict]:
        return [v for v in self.verdicts + self.alone if v.problem is not None]

    def line(self, features: int) -> str:
        return (f"interaction_matrix features={features} pairs={len(self.verdicts)} refused={self.count(REFUSED)} "
                f"equal={self.count(EQUAL)} statistical={self.count(STATISTICAL)} trains={self.count(TRAINS)} "
                f"failing={len(self.failing)} seconds={self.seconds:.0f}")


def key(spec: dict) -> str:
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_pairs(pairs: List[Pair], alone: List[Feature] = (), log=print) -> Report:
    start = time.time()
    jobs: Dict[str, dict] = {}
    for p in pairs:
        for spec in (p.spec(), p.twin_spec()):
            if spec is not None:
                jobs[key(spec)] = spec
    for f in alone:
        jobs[key(configuration(f))] = configuration(f)
    results = {k: execute(s) for k, s in jobs.items() if s["processes"] == 1}
    launched = {k: s for k, s in jobs.items() if s["processes"] > 1}
    report = Report()
    if launched:
        results.update(_launch(launched, report, log))
    for p in pairs:
        report.verdicts.append(_safely(judge, p, results))
        if report.verdicts[-1].problem:
            log(f"FAIL {p.name}: {report.verdicts[-1].problem}")
    for f in alone:
        report.alone.append(_safely(judge_alone, f, results[key(configuration(f))]))
        if report.alone[-1].problem:
            log(f"FAIL {f.name} (alone): {report.alone[-1].problem}")
    report.seconds = time.time() - start
    return report


def _safely(judge_one, what, results) -> Verdict:
    """An oracle that raises is a failing verdict, never the end of the run."""
    try:
        return judge_one(what, results)
    except Exception as error:  # noqa: BLE001
        return Verdict(what.name, "error", f"the oracle raised {type(error).__name__}: {error}")


def _outcome(record: dict, spec: dict):
    settings = spec["settings"]
    private = settings.get("dp_mode", "off") != "off" or bool(settings.get("secure_aggregation"))
    return SimpleNamespace(state=record["state"], initial=record["initial"], history=record["history"],
                           masks=record.get("masks", []), shard_masks=record.get("shard_masks") or [],
                           private=private)


def judge(p: Pair, results: Dict[str, dict]) -> Verdict:
    spec = p.spec()
    record = results[key(spec)]
    if "refused" in record:
        problem = record["refusal_problem"]
        if problem is None and p.processes > 1 and lookup(spec) is None:
            problem = "refused by the launch, but the table's lookup on one process lets it through"
        return Verdict(p.name, REFUSED, problem)
    if "crash" in record:
        return Verdict(p.name, p.choice()[0], f"crashed: {record['crash'][:300]}")
    if p.processes > 1 and lookup(spec) is not None:
        return Verdict(p.name, REFUSED, f"the lookup refuses it, the launch trained: {lookup(spec)}")
    oracle, f, tolerance = p.choice()
    run = _outcome(record, spec)
    if oracle == EQUAL:
        twin_spec = p.twin_spec()
        if twin_spec is None:
            return Verdict(p.name, oracle, equal(run, run, tolerance[0], tolerance[1], initial=True))
        twin = results[key(twin_spec)]
        if "state" not in twin:
            return Verdict(p.name, oracle, f"the twin did not train: {twin.get('refused') or twin.get('crash')}")
        return Verdict(p.name, oracle, equal(run, _outcome(twin, twin_spec), tolerance[0], tolerance[1],
                                             wire=any(g.twin is not None and g.twin.wire for g in (p.a, p.b))))
    if oracle == STATISTICAL:
        return Verdict(p.name, oracle, PROPERTIES[f.statistical](run))
    return Verdict(p.name, oracle, trains(run))


def judge_alone(f: Feature, record: dict) -> Verdict:
    if f.name in MUST_REFUSE:
        if "refused" not in record:
            return Verdict(f.name, REFUSED, "trained; the docs say it is refused" if "state" in record
                           else f"crashed: {record['crash'][:300]}")
        return Verdict(f.name, REFUSED, record["refusal_problem"])
    if "refused" in record:
        return Verdict(f.name, REFUSED, record["refusal_problem"])
    if "crash" in record:
        return Verdict(f.name, TRAINS, f"crashed: {record['crash'][:300]}")
    return Verdict(f.name, TRAINS, trains(_outcome(record, configuration(f))))


def _launch(specs: Dict[str, dict], report: Report, log, timeout: float = 900) -> Dict[str, dict]:
    """Every 2-process configuration in one torchrun launch; after a crash (its record written by process 0, or,
    when a launch wrote nothing, recorded here for the first configuration), the rest in a new one."""
    out = tempfile.mkdtemp(prefix="fedhf-matrix-launch-")
    specs_file = os.path.join(out, "specs.json")
    with open(specs_file, "w") as f:
        json.dump(specs, f, default=str)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error"}
    results: Dict[str, dict] = {}
    while len(results) < len(specs):
        before = len(results)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                   "fedhf.interactions.worker", specs_file, out]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
            tail = (done.stdout + done.stderr)[-800:]
        except subprocess.TimeoutExpired as error:
            tail = f"timed out after {timeout} s: {str(error.stdout)[-400:]}"
        report.launches += 1
        for k in specs:
            path = os.path.join(out, k + ".pt")
            if k not in results and os.path.exists(path):
                results[k] = torch.load(path, weights_only=False)
        missing = [k for k in specs if k not in results]
        if missing and len(results) == before:  # no result at all: the first configuration ended the launch
            results[missing[0]] = {"crash": f"the launch ended: {tail}"}
            torch.save(results[missing[0]], os.path.join(out, missing[0] + ".pt"))
            log(f"launch {report.launches} ended at configuration {missing[0]}; relaunching for {len(missing) - 1}")
    return results


def refusal_problem(error: BaseException) -> Optional[str]:
    return refusal_ok(error)
