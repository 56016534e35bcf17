"""`tfusion doctor`: is this installation healthy, and if not, what to do about it.

Why a package of its own: the faults that leave pods Pending with no event (a CRD at an older
schema, a webhook the API server cannot verify, no leader, a node whose hypervisor stopped) each
take a different command to find. Here each check reads the cluster as the user (their RBAC decides
what it can see) and says what it found and the fix; it writes nothing (the webhook probe is a
server-side dry run). It is a client like `tfusion why`, so it sits beside it, above the roles whose
names (webhook configuration, Lease, certificate Secret, shipped RBAC) it reads from their modules.
"""
