"""Cloud deployments as a target: instance family, size and node count."""
