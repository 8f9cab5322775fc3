"""How a round's clients are trained: the runners (``base``: one at a time or client-parallel;
``batched_round``), one client's local steps and what they read (``client_data``, ``labelled_positions``,
``loss_scaling``), and the memory plan of running them."""
