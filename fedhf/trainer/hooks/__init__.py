"""Round hooks: the protocol (``base``), the run's list of them (``round_features``) and every round feature
built as one (privacy, compression, the clock, the best round, the exclusion guard, drift metrics, the round timer,
outputs, NEFTune, personalised evaluation)."""
