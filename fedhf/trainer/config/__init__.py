"""What is decided when a :class:`FederatedConfig` is made: its fields by group (``*_settings``), the
Trainer-settings table, the config checks, the fields' help, the refused combinations and the LLM guidance."""
