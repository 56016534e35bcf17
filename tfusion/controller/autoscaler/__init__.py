"""Vertical autoscaling of GPU shares: recommendations from measured usage, cron rules and external scalers.

The pure parts: `histogram` (decaying exponential-bucket histograms), `policy` (spec.autoScalingConfig
parsed, defaulted and checked), `cron` (cron windows), `recommender` (percentiles -> a share). The parts
that meet the world: `sources` (where usage samples come from), `external` (an external scaler over
HTTP), `resize` (a running worker's share changed in place), `service` (the leader's loop that ties
them together and writes the workload's status) and `http` (`GET /api/recommendation`).
"""
