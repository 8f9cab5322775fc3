"""The round's shared vocabulary: what a client and the server see (context), what a client sends (message), how
messages add up (sums), tensor dicts (params), Theta's structure (theta), shared moment updates (updates), the
registries, the seeded schedule, the LoRA names and the per-client state store.

Import rule: nothing here imports any other part of fedhf (tests/test_layout.py).
"""
