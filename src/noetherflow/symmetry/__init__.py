"""Parameter symmetries: the families' group actions, sets, coverage and detection."""
