"""Pairs of features: enumeration, the oracle each pair carries, the refusal lookup, and one pair's verdict. Every two
features of different axes form a pair (features of one axis are alternatives), except two parts of an algorithm
(server rule, correction, local optimizer, state sync): such a pair is an algorithm, whose composition the algorithm
registry checks (compose()); the algorithms are checked alone. A pair is refused when the refusal table refuses its
configuration (looked up by building it; a 2-process pair is looked up on this process with the launch's settings,
and the launch must agree), else it carries the first oracle that applies: a ``first`` property (dropout), a neutral
twin (preferring a launch's, then one that is not the initial model), another property, or "it trains"."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from itertools import combinations
from typing import List, Optional, Tuple

from .features import Feature, features
from .reference import merge

EQUAL, STATISTICAL, TRAINS, REFUSED = "equal", "statistical", "trains", "refused"
LAUNCH_FIELDS = ("client_parallel", "fsdp")
# an algorithm's parts: a pair of two of them is an algorithm (compose() checks it; the algorithms run alone)
ALGORITHM_PARTS = ("server_rule", "correction", "local_optimizer", "state_sync")


@dataclass(frozen=True)
class Pair:
    a: Feature
    b: Feature

    @property
    def name(self) -> str:
        return f"{self.a.name} x {self.b.name}"

    @property
    def processes(self) -> int:
        return max(self.a.processes, self.b.processes)

    def spec(self) -> dict:
        return configuration(self.a, self.b)

    def choice(self) -> Tuple[str, Optional[Feature], Optional[Tuple[float, float, str]]]:
        """(oracle, the feature that brings it, (rtol, atol, source) for a twin)."""
        a, b = self.a, self.b
        for f in (a, b):
            if f.statistical and f.first:
                return STATISTICAL, f, None
        twins = [(f, f.twin.tolerance(o.name)) for f, o in ((a, b), (b, a)) if f.twin is not None]
        twins = [(f, t) for f, t in twins if t is not None]
        if twins:
            f, t = sorted(twins, key=lambda ft: (-ft[0].processes, ft[0].twin.initial))[0]
            if len(twins) == 2:  # both neutral: the looser of the two tolerances
                t = (max(twins[0][1][0], twins[1][1][0]), max(twins[0][1][1], twins[1][1][1]), t[2])
            return EQUAL, f, t
        for f, other in ((a, b), (b, a)):
            if f.statistical and not (f.statistical == "fedbuff_times" and changes_message_size(other)):
                return STATISTICAL, f, None
        return TRAINS, None, None

    def twin_spec(self) -> Optional[dict]:
        """The twin's configuration: the pair without its neutral feature (None: the initial model is the twin)."""
        oracle, f, _ = self.choice()
        if oracle != EQUAL or f.twin.initial:
            return None
        other = self.b if f is self.a else self.a
        return configuration(other)


def changes_message_size(f: Feature) -> bool:
    """A feature whose clients' messages are not the dense model change from round 2 on (compressed, half the
    adapter, or with a correction's or an optimizer state's tensors added): FedBuff times round 1 with the dense
    size and later dispatches with the measured one, so its updates are no longer whole multiples of one round
    (the fedbuff_times property holds for dense messages only)."""
    axis = f.name.split(":")[0]
    if f.name in ("correction:proximal", "state_sync:persist_local"):  # nothing added to the message
        return False
    return (axis in ("uplink_compression", "downlink_compression", "error_feedback", "correction", "state_sync")
            or f.name == "parameter_sharing:rolora")


def configuration(*fs: Feature) -> dict:
    """The features' settings merged; each feature's own field (its axis) keeps its value."""
    spec = merge(*(f.spec() for f in fs))
    for f in fs:
        if f.axis in f.settings:
            spec["settings"][f.axis] = f.settings[f.axis]
    spec["processes"] = max(f.processes for f in fs)
    return spec


def pairs(selected: Optional[List[Feature]] = None) -> List[Pair]:
    paired = [f for f in (selected or features()) if not f.alone]
    return [Pair(a, b) for a, b in combinations(paired, 2)
            if a.axis != b.axis and not (a.axis in ALGORITHM_PARTS and b.axis in ALGORITHM_PARTS)]


def alone() -> List[Feature]:
    return [f for f in features() if f.alone]


def lookup(spec: dict) -> Optional[BaseException]:
    """The refusal the table raises for a configuration, on this process: a 2-process configuration is built
    without its launch fields and the table read with them and a world of 2."""
    from .reference import build

    launch = {k: spec["settings"][k] for k in LAUNCH_FIELDS if k in spec["settings"]}
    local = {**spec, "settings": {k: v for k, v in spec["settings"].items() if k not in launch}}
    try:
        if spec.get("processes", 1) == 1:
            build(spec, tempfile.mkdtemp(prefix="fedhf-lookup-"))
            return None
        trainer = build(local, tempfile.mkdtemp(prefix="fedhf-lookup-"))
        _launch_table(trainer, {**spec["settings"]})
    except ValueError as error:
        return error
    return None


def _launch_table(trainer, settings: dict) -> None:
    from types import SimpleNamespace
    from unittest import mock

    from ..trainer.config import combinations as table
    from ..trainer.config import federated_config
    from ..trainer.config.federated_config import FederatedConfig
    from ..trainer.federated_trainer import FederatedTrainer

    args = trainer.args
    with mock.patch.object(federated_config, "check_fsdp_launch", lambda args: None):  # as a launched process
        launch_args = FederatedConfig(**{**{f.name: getattr(args, f.name) for f in _init_fields(args)},
                                         **{k: settings[k] for k in LAUNCH_FIELDS if k in settings}})

    class LaunchSetup(table.Setup):
        @property
        def args(self):
            return launch_args

        @property
        def world(self):
            return SimpleNamespace(size=2, rank=0)

    table._refuse(LaunchSetup(trainer, trainer_class=FederatedTrainer), table.COMBINATIONS)


def _init_fields(args):
    import dataclasses

    return [f for f in dataclasses.fields(args) if f.init]


def find_pair(a: str, b: str) -> Pair:
    for p in pairs():
        if {p.a.name, p.b.name} == {a, b}:
            return p
    raise KeyError(f"no pair {a} x {b}")


def covering_subset(rotation: int = 7) -> Tuple[List[Pair], List[Feature]]:
    """What the suite runs: every paired feature at least once in a 1-process pair (its partner chosen by a fixed
    rotation through the feature list, so each partner differs), the pairs that catch the review's findings
    (features.FINDINGS), and the features checked alone that the findings name."""
    from .features import FINDINGS

    paired = [f for f in features() if not f.alone]
    chosen: List[Pair] = []
    for i, f in enumerate(paired):
        for step in range(rotation, rotation + len(paired)):
            g = paired[(i + step) % len(paired)]
            if g.processes == 1 and f.processes == 1 and g.axis != f.axis and not (
                    f.axis in ALGORITHM_PARTS and g.axis in ALGORITHM_PARTS):
                chosen.append(Pair(f, g))
                break
    lone = []
    for _, cases in FINDINGS.values():
        for case in cases:
            if len(case) == 2:
                chosen.append(find_pair(*case))
            else:
                lone += [f for f in alone() if f.name == case[0]]
    unique = {p.name: p for p in chosen}
    return list(unique.values()), lone
