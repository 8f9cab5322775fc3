"""The secure-aggregation label is found by running an algorithm's server halves on sums only: robust rules are
caught reading individual updates, every named algorithm reads sums, and a rule that reads them without declaring
it is caught too."""

from __future__ import annotations

from fedhf.algorithms import compose, get_algorithm, list_algorithms
from fedhf.server.mean import Mean
from fedhf.privacy.secagg_check import secagg_compatibility


def test_every_named_algorithm_reads_only_sums():
    assert all(secagg_compatibility(get_algorithm(name))[0] for name in list_algorithms())


def test_robust_rules_are_found_reading_each_update():
    for rule in ("median", "trimmed_mean", "median+momentum"):
        compatible, reason = secagg_compatibility(compose("fedavg", {}, server_rule=rule))
        assert not compatible and "reads each client's update" in reason and rule in reason
    for rule in ("mean", "adam", "fedsvd", "flexlora", "fedex_lora", "flora"):
        assert secagg_compatibility(compose("fedavg", {}, server_rule=rule))[0], rule


def test_an_undeclared_read_of_individual_updates_is_found_by_running_it():
    class Sneaky(Mean):  # declares nothing (gathers=False) but looks at the first client's update
        def aggregate(self, ctx):
            first = ctx.gathered[0]
            return {n: first[n] for n in ctx.global_params}

    algorithm = compose("fedavg", {})
    algorithm.server_rule.aggregator = Sneaky()
    assert Sneaky.gathers is False and not secagg_compatibility(algorithm)[0]
