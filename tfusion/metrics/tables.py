"""The names of the metrics tables (measures) tfusion writes, in one place.

Why: the controller's recorder, the hypervisor's recorder, the Prometheus families and the readers
(the console's history, the autoscaler's usage sources) must agree on these names; a typo in one of
them would silently read an empty table. They are the original's GreptimeDB table names, which
users query with SQL, so they never change.
"""

from __future__ import annotations

# written by the controller's leader (tfusion/controller/metrics.py)
WORKER_TABLE = "tf_worker_resources"
NODE_TABLE = "tf_node_metrics"
POOL_TABLE = "tf_pool_metrics"
GPU_TABLE = "tf_gpu_metrics"
ALLOCATION_TABLE = "tf_gpu_allocation"
SYSTEM_TABLE = "tf_system_metrics"
CONTROLLER_TABLES = (WORKER_TABLE, NODE_TABLE, POOL_TABLE, GPU_TABLE, ALLOCATION_TABLE, SYSTEM_TABLE)

# written by every hypervisor (tfusion/hypervisor/metrics.py)
GPU_USAGE_TABLE = "tf_gpu_usage"
WORKER_USAGE_TABLE = "tf_worker_usage"
HYPERVISOR_TABLES = (GPU_USAGE_TABLE, WORKER_USAGE_TABLE)
