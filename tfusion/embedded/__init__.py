"""What a one-machine installation needs around the embedded API server, so `tfusion --role=all` works
on a fresh machine: the CRDs and the defaults the original's Helm chart installs (`bootstrap`), a
simulated kubelet for this machine's node (`kubelet`), the GPUNode of that node (`gpunode`, a
stand-in for the controller's Node/GPUNode reconcilers until they land), simulated GPUs where no
driver answers (`devices`) and the startup summary (`summary`). `stage` runs them in order.

Everything here talks to the API server through `tfusion.kube` (HTTP), like any other client.
"""
