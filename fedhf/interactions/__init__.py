"""The interaction matrix: every feature declared once as a settings change on one tiny reference run
(:mod:`.features`), every pair of features refused by the refusal table or checked by an oracle (:mod:`.oracles`:
equality with a neutral twin, a statistical property, or "it trains"), enumerated and run by :mod:`.matrix`.
docs/interactions.md is generated from the declarations (:mod:`.page`); benchmarks/interaction_matrix.py runs the
whole matrix."""
