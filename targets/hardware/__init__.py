"""Device clocks and power as knobs (NVML, cpufreq, Jetson), energy (RAPL), and the
privileged helper and fakes for hardware that is absent."""
