"""The tensor-fusion.ai/v1 models, one module per kind (import them from tfusion.api.types)."""
