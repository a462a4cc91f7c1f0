"""gpuci's bot side: webhooks, trust, commands, config and the CLI."""
