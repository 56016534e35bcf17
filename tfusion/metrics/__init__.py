"""Usage, allocation and cost metrics: the original's GreptimeDB tables, written by both roles.

Why a package of its own: the controller (allocation and cost, `tfusion/controller/metrics.py`) and the hypervisor
(device and worker usage, `tfusion/hypervisor/metrics.py`) write the same kind of points through the
same transports (`points.py` encodes them as InfluxDB line protocol or JSON lines, `sinks.py` appends
them to a rotating file and pushes them over HTTP with a bounded buffer), and the cost formula
(`cost.py`) is a pure function that the controller's recorder calls once per tick. `prometheus.py`
turns the same points into the `tfusion_*` families both roles' /metrics serve.
"""
