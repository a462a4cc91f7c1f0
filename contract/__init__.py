"""What the bot processes and the GPU hosts share, and nothing else: the config model, settings,
Redis key names, GPU leases, Check Run output and the host protocol's messages."""
