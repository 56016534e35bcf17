"""The pod admission webhook: annotations in, a ready-to-schedule worker pod and its workload out.

`mutate` (pure: pod + cached context -> mutated pod and workload, or a Denial), `patch` (the RFC
6902 patch from the difference), `workloads` (TensorFusionWorkload create-or-patch), `certs` (the
serving certificate, kept in a Secret and rotated), `registration` (the
MutatingWebhookConfiguration), `server` (the TLS endpoint) and `service` (wiring them into the
controller runtime).
"""
