"""Cloud providers behind one interface (`base.CloudProvider`): `simulated` (instances are records in
the cluster that `--role=all`'s node farm boots into Nodes with simulated GPUs), `karpenter`
(karpenter.sh/v1 NodeClaims) and `aws` (EC2 through boto3)."""
