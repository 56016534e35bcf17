"""Talking to a Kubernetes API server (a real cluster or the embedded one) over HTTP.

- `resources`: the REST resources tfusion uses, named once.
- `client`: `KubeClient` (kr8s transport) with typed errors and a QPS/burst limit.
- `informer`: shared list+watch caches with indexes and non-blocking handler fan-out.
- `workqueue`: de-duplicating, rate-limited work queue and the reconcile loop.
- `leader`: Lease-based leader election with client-go semantics.
- `auth`: bearer-token authentication through TokenReview, cached.
- `events`: aggregated core/v1 Event recorder.
"""
