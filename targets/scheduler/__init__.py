"""GPU-cluster scheduler parameters as a target, on a trace-driven simulator."""
