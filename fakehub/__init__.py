"""fakehub: an offline GitHub speaking the REST subset gpuci uses, validated against GitHub's own
API description, with a control API that drives scenarios and delivers signed webhooks."""
