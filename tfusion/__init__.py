"""tfusion: GPU pooling and fractional virtual GPUs for Kubernetes, speaking the TensorFusion API."""

__version__ = "0.1.0"
