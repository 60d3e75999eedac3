"""Any program as a target: a command per trial, metrics read from its output."""
