"""--scheduler-config: the GPU plugins' arguments read from a KubeSchedulerConfiguration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfusion.allocator.scoring import Weights
from tfusion.allocator.topology import TopologyArgs
from tfusion.controller.scheduling import config
from tfusion.controller.scheduling.config import SchedulerConfigError, load_scheduler_args, parse_scheduler_args

#: the shape the original ships (its profile, both plugins' args, kube-scheduler's own parts)
SHIPPED = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {qps: 1000, burst: 2000}
profiles:
  - schedulerName: default-scheduler
  - schedulerName: tensor-fusion-scheduler
    plugins:
      score:
        enabled: [{name: GPUResourcesFit, weight: 5}]
    pluginConfig:
      - name: GPUResourcesFit
        args: {maxWorkerPerNode: 64, vramWeight: 0.5, tflopsWeight: 0.5}
      - name: GPUNetworkTopologyAware
        args: {mode: soft, topologySource: auto, maxAllowedTier: 1}
      - name: NodeResourcesFit
        args: {ignoredResourceGroups: [tensor-fusion.ai]}
"""


def test_the_shipped_shape_gives_its_gpu_plugin_args() -> None:
    args = parse_scheduler_args(SHIPPED, source="cfg.yaml")
    assert (args.max_workers_per_node, args.weights, args.source) == (64, Weights(vram=0.5, tflops=0.5), "cfg.yaml")
    assert args.topology == TopologyArgs(mode="soft", source="auto", max_tier=1)


def test_defaults_without_gpu_plugin_args_or_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = parse_scheduler_args("kind: KubeSchedulerConfiguration\nprofiles: [{schedulerName: x}]\n", source="f")
    assert (bare.max_workers_per_node, bare.weights) == (None, Weights())
    monkeypatch.setattr(config, "DEFAULT_PATH", tmp_path / "absent.yaml")
    assert load_scheduler_args("") == config.SchedulerArgs()  # unset and the default path absent: defaults
    with pytest.raises(SchedulerConfigError, match=r"--scheduler-config .*nope\.yaml: no such file"):
        load_scheduler_args(str(tmp_path / "nope.yaml"))  # named on purpose: must exist
    path = tmp_path / "s.yaml"
    path.write_text(SHIPPED)
    monkeypatch.setattr(config, "DEFAULT_PATH", path)
    assert load_scheduler_args("").max_workers_per_node == 64


def test_the_profile_named_tensor_fusion_scheduler_else_the_only_one_with_gpu_args() -> None:
    two = """
kind: KubeSchedulerConfiguration
profiles:
  - {schedulerName: a, pluginConfig: [{name: GPUResourcesFit, args: {maxWorkerPerNode: 1}}]}
  - {schedulerName: b, pluginConfig: [{name: GPUResourcesFit, args: {maxWorkerPerNode: 2}}]}
"""
    with pytest.raises(SchedulerConfigError, match="2 profiles configure GPU plugins and none is named"):
        parse_scheduler_args(two, source="f")
    one = "kind: KubeSchedulerConfiguration\nprofiles: [{schedulerName: a, pluginConfig: " \
          "[{name: GPUResourcesFit, args: {maxWorkerPerNode: 9}}]}, {schedulerName: b}]\n"
    assert parse_scheduler_args(one, source="f").max_workers_per_node == 9


TOPOLOGY_HEAD = "kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUNetworkTopologyAware, args: "


@pytest.mark.parametrize(("text", "says"), [
    ("{", "f: not YAML"),
    ("kind: Deployment", "kind 'Deployment'; expected a KubeSchedulerConfiguration"),
    ("[1, 2]", "kind 'list'; expected a KubeSchedulerConfiguration"),
    ("kind: KubeSchedulerConfiguration\nprofiles: {a: 1}", "profiles must be a list"),
    ("kind: KubeSchedulerConfiguration\nprofiles: [{schedulerName: tensor-fusion-scheduler, pluginConfig: {a: 1}}]",
     "pluginConfig must be a list"),
    ("kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUResourcesFit, args: [1]}]}]",
     r"pluginConfig\[0\] \(GPUResourcesFit\) args must be a mapping"),
    ("kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUResourcesFit, args: {vramWeigth: 1}}]}]",
     "GPUResourcesFit args vramWeigth: unknown; allowed: maxWorkerPerNode, vramWeight, tflopsWeight"),
    ("kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUResourcesFit, args: {vramWeight: -1}}]}]",
     "GPUResourcesFit vramWeight -1; expected a number of 0 or more"),
    ("kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUResourcesFit, args: "
     "{tflopsWeight: .nan}}]}]", "tflopsWeight nan"),
    ("kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUResourcesFit, args: "
     "{maxWorkerPerNode: 0}}]}]", "maxWorkerPerNode 0; expected an integer of 1 or more"),
    ("kind: KubeSchedulerConfiguration\nprofiles: [{pluginConfig: [{name: GPUNetworkTopologyAware, args: "
     "{mode: strict}}]}]", "GPUNetworkTopologyAware mode 'strict'; allowed: soft, hard"),
    (f"{TOPOLOGY_HEAD}{{topologySource: pci}}}}]}}]", "topologySource 'pci'; allowed: auto, numa, vendor"),
    (f"{TOPOLOGY_HEAD}{{maxAllowedTier: 4}}}}]}}]", "maxAllowedTier 4; allowed: an integer from 0 to 3"),
    (f"{TOPOLOGY_HEAD}{{maxAllowedTier: '1'}}}}]}}]", "maxAllowedTier '1'; allowed: an integer from 0 to 3"),
    (f"{TOPOLOGY_HEAD}{{unknownTopologyPolicy: drop}}}}]}}]",
     "unknownTopologyPolicy 'drop'; allowed: treat-as-worst, reject"),
    (f"{TOPOLOGY_HEAD}{{preferLeastDamage: 'yes'}}}}]}}]", "preferLeastDamage 'yes'; allowed: true, false"),
    (f"{TOPOLOGY_HEAD}{{maxTier: 1}}}}]}}]", "GPUNetworkTopologyAware args maxTier: unknown; allowed: mode, "
                                           "topologySource, maxAllowedTier, unknownTopologyPolicy, preferLeastDamage"),
])
def test_a_bad_file_says_which_field_and_what_is_allowed(text: str, says: str) -> None:
    with pytest.raises(SchedulerConfigError, match=says):
        parse_scheduler_args(text, source="f")


def test_every_topology_argument_is_read_and_hard_mode_is_taken() -> None:
    text = f"{TOPOLOGY_HEAD}{{mode: hard, topologySource: vendor, maxAllowedTier: 0, " \
           "unknownTopologyPolicy: reject, preferLeastDamage: false}}]}]"
    args = parse_scheduler_args(text, source="f").topology
    assert args == TopologyArgs(mode="hard", source="vendor", max_tier=0, unknown_policy="reject",
                                prefer_least_damage=False)
    policy = args.policy()
    assert (policy.hard, policy.gates, policy.reject_unknown, policy.least_damage) == (True, True, True, False)
    assert parse_scheduler_args("kind: KubeSchedulerConfiguration\n", source="f").topology == TopologyArgs()
