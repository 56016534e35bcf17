"""`tfusion console`: a web console over what the cluster and the controller already say.

Why a package of its own: it is a client, like `tfusion why` — it reads the cluster with the user's
own kubeconfig (informers, so the user's RBAC decides what it shows) and asks the leader's HTTP API
for what only the leader knows (explanations, current usage). It imports no controller code: the
pages render the answers the controller gives, never a second copy of its rules.
"""
