"""Programs that targets run and measure (an inference server, a pipeline-parallel
training job), kept apart from the adapters that set knobs around them."""
