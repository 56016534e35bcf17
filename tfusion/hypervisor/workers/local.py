"""The local backend (`--backend=local`): tfusion on one GPU box without Kubernetes.

Workers are created over HTTP (`POST /api/v1/workers`), placed by the same allocator as the
controller, persisted in `<state-dir>/workers.json` (devices in `devices.json`, both in the
original's JSON shape, written atomically) and restored after a restart. A worker with a `command`
runs as a supervised process group with its allocation's env, restarted with backoff (3 s doubling
to 60 s) when it exits; its output goes to `<state-dir>/logs/<namespace>/worker-<name>.log`.

Nothing runs that tfusion does not track, even across kill -9: each worker's process group (pgid
and the leader's start time) is persisted with the worker as `WorkerRunningInfo.processGroup`, and
every worker process carries a marker (`TF_LOCAL_WORKER=<state-dir>#<uid>`). At start, a recorded
group whose leader is still the same process is adopted (watched, not started again); any other
process carrying one of this state dir's markers is stopped (SIGTERM, then SIGKILL) before fresh
copies start. Deleting a worker, and stopping tfusion (SIGTERM), stop its whole group the same way.

The state files hold each worker's command line and env, the logs whatever the worker prints: the
state directory and the log directories are created 0700 and every file in them is 0600 (set
explicitly, whatever the umask). A crash between writing a state file's temp copy and renaming it
leaves `<file>.<random>.tmp`; those are removed at start.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid as uuidlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup

from tfusion.api.annotations import ISOLATION_SOFT
from tfusion.api.jsontypes import JsonMapping
from tfusion.hypervisor.devices.registry import DeviceChanges, DeviceRegistry
from tfusion.hypervisor.http import ApiError
from tfusion.hypervisor.private import PRIVATE_FILE_MODE, private_directory
from tfusion.hypervisor.shm.state import ShmError
from tfusion.hypervisor.shm.store import SHM_FILE
from tfusion.hypervisor.workers.allocation import build_allocation
from tfusion.hypervisor.workers.model import (
    STATUS_RUNNING,
    RunningInfo,
    WorkerAllocation,
    WorkerAmounts,
    WorkerInfo,
    WorkerWire,
)
from tfusion.hypervisor.workers.placement import NodePlacer, PlacementError
from tfusion.hypervisor.workers.procfs import ProcFS
from tfusion.hypervisor.workers.spec import SpecError, parse_worker_spec
from tfusion.hypervisor.workers.supervisor import (
    MARKER_ENV,
    STOP_GRACE_S,
    ProcessGroup,
    ProcessSupervisor,
    leader_is_alive,
    stop_group,
)

log = logging.getLogger(__name__)

WORKERS_FILE = "workers.json"
DEVICES_FILE = "devices.json"


_TEMP_SUFFIX = ".tmp"


def preload_first(library: str, preload: str) -> str:
    """LD_PRELOAD with `library` first (ld.so splits the list at spaces and colons), named once."""
    others = [p for p in preload.replace(":", " ").split() if p != library]
    return " ".join([library, *others])


def write_json_atomic(path: Path, value: Any) -> None:
    """Write to a 0600 temp file in the same directory, fsync, then rename over the target."""
    private_directory(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=_TEMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "w") as handle:
            handle.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with anyio.CancelScope(shield=True):
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


@dataclass
class _LocalWorker:
    info: WorkerInfo
    allocation: WorkerAllocation
    running: RunningInfo | None = None
    supervisor: ProcessSupervisor | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: a still-running group found at start, to be adopted instead of started again
    adopt: ProcessGroup | None = None


def remove_stale_temp_files(directory: Path, names: Collection[str]) -> list[Path]:
    """Delete the temp copies of `names` (`<name>.<random>.tmp`) that a crash left in `directory`."""
    removed = []
    for name in names:
        for leftover in directory.glob(f"{name}.*{_TEMP_SUFFIX}"):
            try:
                leftover.unlink()
            except FileNotFoundError:
                continue
            removed.append(leftover)
    return removed


class LocalWorkers:
    """Workers of a single-node hypervisor."""

    kind = "local"

    def __init__(self, state_dir: Path, registry: DeviceRegistry, *, node_name: str, pool: str,
                 process_env: Mapping[str, str], procfs: ProcFS | None = None,
                 stop_grace: float = STOP_GRACE_S, shm_root: Path | None = None, limiter_library: str = "") -> None:
        self.state_dir = state_dir
        self.shm_root = shm_root  # soft workers are told their shared-memory file (TF_SHM_PATH)
        self.limiter_library = limiter_library  # preloaded into soft workers' processes when set
        #: makes a soft worker's shared-memory file before its process starts (role.py sets it)
        self.prepare_soft: Callable[[WorkerAllocation], object] | None = None
        self.stop_grace = stop_grace
        self.registry = registry
        self.node_name = node_name
        self.pool = pool
        self.process_env = dict(process_env)
        self.procfs = procfs or ProcFS()
        self.placement = NodePlacer(node_name=node_name, pool=pool)
        self._workers: dict[str, _LocalWorker] = {}
        self._lock = anyio.Lock()
        self._tg: TaskGroup | None = None
        self._restored = False

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Restore persisted workers (devices must be discovered), then supervise until cancelled."""
        private_directory(self.state_dir)
        for leftover in remove_stale_temp_files(self.state_dir, (WORKERS_FILE, DEVICES_FILE)):
            log.info("removed %s, left by an interrupted write", leftover)
        self.registry.subscribe(self._on_devices)
        self.placement.sync_devices(self.registry.devices())
        if self.registry.discovered:
            write_json_atomic(self.state_dir / DEVICES_FILE, [d.to_wire() for d in self.registry.devices()])
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self._restore()
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await self._stop_all()

    async def _on_devices(self, changes: DeviceChanges) -> None:
        self.placement.sync_devices(changes.current)
        write_json_atomic(self.state_dir / DEVICES_FILE, [d.to_wire() for d in changes.current])
        if changes.changed:  # allocations show the devices as they are now (health, presence)
            known = {d.uuid for d in changes.current}
            for worker in self._workers.values():
                present = worker.info.replace(allocated_devices=tuple(
                    u for u in worker.info.allocated_devices if u in known))
                worker.allocation = self._allocation(present)

    async def _restore(self) -> None:
        path = self.state_dir / WORKERS_FILE
        records: list[WorkerWire] = []
        if path.exists():
            try:
                records = orjson.loads(path.read_bytes())
            except ValueError as exc:
                raise RuntimeError(f"{path} is not valid JSON ({exc}); fix or remove it") from None
        leftovers = [self._restore_one(raw) for raw in records]
        keep = {w.adopt.pgid for w in self._workers.values() if w.adopt is not None}
        await self._stop_groups([g for g in leftovers if g is not None] + self._stray_groups(keep=keep))
        # every record is back in memory before any starts: each start persists the whole list
        for worker in list(self._workers.values()):
            if worker.running is not None:
                await self._start(worker)
        self._restored = True
        if records:
            log.info("restored %d local worker(s) from %s", len(records), path)

    def _restore_one(self, raw: WorkerWire) -> tuple[ProcessGroup, str] | None:
        """Bring one record back; returns its recorded group when that must be stopped (its leader
        is gone or it has no command any more), None when there is none or it is adopted."""
        known = {d.uuid: d for d in self.registry.devices()}
        info = WorkerInfo.from_wire(raw)
        raw_running = raw.get("WorkerRunningInfo")
        running = RunningInfo.from_wire(raw_running) if isinstance(raw_running, dict) else None
        group = ProcessGroup.from_wire(raw_running.get("processGroup")) if isinstance(raw_running, dict) else None
        missing = [u for u in info.allocated_devices if u not in known]
        if missing:
            log.error("local worker %s holds devices that are gone (%s); keeping its record without "
                      "devices until it is deleted", info.name, ", ".join(missing))
        try:
            self.placement.restore(info, [u for u in info.allocated_devices if u in known])
        except PlacementError as exc:
            log.error("cannot restore the allocation of local worker %s: %s", info.name, exc)
        allocation = self._allocation(info.replace(allocated_devices=tuple(
            u for u in info.allocated_devices if u in known)))
        worker = _LocalWorker(info=allocation.worker, allocation=allocation, running=running)
        self._workers[info.uid] = worker
        if group is None:
            return None
        if running is not None and leader_is_alive(self.procfs, group):
            worker.adopt = group
            return None
        return group, self._marker(info.uid)

    # --- process groups ----------------------------------------------------------------------------

    @property
    def _marker_prefix(self) -> str:
        return f"{self.state_dir.resolve()}#"

    def _marker(self, uid: str) -> str:
        """The value of TF_LOCAL_WORKER in every process of worker `uid`."""
        return self._marker_prefix + uid

    def _stray_groups(self, *, keep: Collection[int] = (), uid: str = "") -> list[tuple[ProcessGroup, str]]:
        """Process groups holding a process that carries one of our markers (only worker `uid`'s
        when given), except the groups in `keep`: what a crash or a setsid left behind."""
        wanted = self._marker(uid) if uid else self._marker_prefix
        found: dict[int, str] = {}
        for pid in self.procfs.pids():
            marker = self.procfs.environ(pid).get(MARKER_ENV, "")
            if not (marker == wanted if uid else marker.startswith(wanted)):
                continue
            stat = self.procfs.stat(pid)
            if stat is not None and stat.alive and stat.pgrp not in keep and stat.pgrp > 1:
                found.setdefault(stat.pgrp, marker)
        return [(ProcessGroup(pgid, 0), marker) for pgid, marker in sorted(found.items())]

    async def _stop_groups(self, groups: list[tuple[ProcessGroup, str]]) -> None:
        if not groups:
            return
        log.warning("stopping %d leftover local worker process group(s): %s", len(groups),
                    ", ".join(str(g.pgid) for g, _ in groups))
        async with anyio.create_task_group() as tg:
            for group, marker in groups:
                tg.start_soon(stop_group, self.procfs, group, marker, self.stop_grace)

    async def _stop_all(self) -> None:
        """On shutdown: every supervised group, then anything else that carries our marker."""
        async with anyio.create_task_group() as tg:
            for worker in list(self._workers.values()):
                if worker.supervisor is not None:
                    tg.start_soon(worker.supervisor.stop)
        await self._stop_groups(self._stray_groups())

    # --- reads (WorkerTracker) ---------------------------------------------------------------------

    def allocations(self) -> list[WorkerAllocation]:
        return [w.allocation for w in sorted(self._workers.values(), key=lambda w: (w.info.namespace, w.info.name))
                if w.allocation.devices]

    def get(self, worker_id: str) -> WorkerAllocation | None:
        worker = self._find(worker_id)
        return worker.allocation if worker else None

    def _find(self, worker_id: str) -> _LocalWorker | None:
        """A worker by UID, or by name when that is unique across namespaces."""
        if worker_id in self._workers:
            return self._workers[worker_id]
        named = [w for w in self._workers.values() if w.info.name == worker_id]
        if len(named) > 1:
            raise ApiError(409, f"worker name {worker_id!r} is used in several namespaces; use the UID",
                           field="worker_id", reasons=sorted(f"{w.info.namespace}/{w.info.name}: {w.info.uid}"
                                                             for w in named))
        return named[0] if named else None

    def tracks(self, uid: str) -> bool:
        return uid in self._workers

    @property
    def restored(self) -> bool:
        """Whether the persisted workers are back (before that, every shm file looks like a stray)."""
        return self._restored

    def running_info(self, uid: str) -> RunningInfo | None:
        worker = self._workers.get(uid)
        if worker is None or worker.running is None:
            return None
        if worker.supervisor is not None:
            worker.supervisor.update(worker.running)
        return worker.running

    def worker_for_pid(self, pid: int) -> str | None:
        roots = {w.supervisor.pid: uid for uid, w in self._workers.items() if w.supervisor and w.supervisor.pid}
        if pid in roots:
            return roots[pid]
        for ancestor in self.procfs.ancestors(pid):
            if ancestor in roots:
                return roots[ancestor]
        return None

    # --- writes ------------------------------------------------------------------------------------

    def _allocation(self, info: WorkerInfo) -> WorkerAllocation:
        known = {d.uuid: d for d in self.registry.devices()}
        # No HYPERVISOR_IP: a local worker's processes are tied to it through /proc (ancestry), and a
        # preloaded limiter would try to register with a pod token that does not exist here.
        identity = {"POD_NAME": info.name, "POD_NAMESPACE": info.namespace, "TF_WORKER_UID": info.uid}
        if self.shm_root is not None and info.isolation == ISOLATION_SOFT:
            identity["TF_SHM_PATH"] = str(self.shm_root / info.namespace / info.name / SHM_FILE)
        return build_allocation(info, known, bare_process=True, extra_env=identity)

    async def create(self, body: JsonMapping) -> WorkerAllocation:
        async with self._lock:
            devices = self.registry.devices()
            try:
                spec = parse_worker_spec(body, devices)
            except SpecError as exc:
                raise ApiError(422, str(exc), field=exc.field) from None
            if any(w.info.name == spec.name and w.info.namespace == spec.namespace for w in self._workers.values()):
                raise ApiError(409, f"worker {spec.namespace}/{spec.name} already exists", field="name")
            uid = str(uuidlib.uuid4())
            try:
                request, gpu_names = self.placement.allocate(uid, spec)
            except SpecError as exc:
                raise ApiError(422, str(exc), field=exc.field) from None
            except PlacementError as exc:
                raise ApiError(409, str(exc), free=self.placement.free_summary(), reasons=exc.reasons) from None
            info = WorkerInfo(
                uid=uid, namespace=spec.namespace, name=spec.name, allocated_devices=tuple(gpu_names),
                status=STATUS_RUNNING, qos=request.qos, isolation=request.isolation,
                requests=WorkerAmounts(request.tflops_request, request.percent_request / 1000, request.vram_request),
                limits=WorkerAmounts(request.tflops_limit, request.percent_limit / 1000, request.vram_limit),
                workload_name=spec.name, labels=spec.labels, annotations=spec.annotations)
            try:
                allocation = self._allocation(info)
                running = (RunningInfo(executable=spec.command[0], args=list(spec.command[1:]), env=dict(spec.env),
                                       working_dir=spec.working_dir) if spec.command else None)
                worker = _LocalWorker(info=info, allocation=allocation, running=running)
                self._workers[uid] = worker
                self._persist()
            except BaseException:
                self._workers.pop(uid, None)
                self.placement.release(uid)
                raise
            if running is not None:
                await self._start(worker)
                self._persist_soon()
            log.info("local worker %s/%s (%s) allocated %s", info.namespace, info.name, uid, ", ".join(gpu_names))
            return allocation

    async def remove(self, worker_id: str) -> WorkerAllocation | None:
        async with self._lock:
            worker = self._find(worker_id)
            if worker is None:
                return None
            if worker.supervisor is not None:
                await worker.supervisor.stop()
            await self._stop_groups(self._stray_groups(uid=worker.info.uid))
            del self._workers[worker.info.uid]
            self.placement.release(worker.info.uid)
            self._persist()
            log.info("local worker %s/%s deleted; released %s", worker.info.namespace, worker.info.name,
                     ", ".join(worker.info.allocated_devices) or "nothing")
            return worker.allocation

    async def _start(self, worker: _LocalWorker) -> None:
        assert self._tg is not None and worker.running is not None
        self._ensure_shm(worker.allocation)
        env = {**self.process_env, **worker.allocation.envs, **worker.running.env}
        if self.limiter_library and worker.info.isolation == ISOLATION_SOFT:
            env["LD_PRELOAD"] = preload_first(self.limiter_library, env.get("LD_PRELOAD", ""))
        supervisor = ProcessSupervisor(name=worker.info.name, argv=[worker.running.executable, *worker.running.args],
                                       env=env, cwd=worker.running.working_dir or None,
                                       log_dir=self.log_dir / worker.info.namespace, on_change=self._persist_soon,
                                       stop_grace=self.stop_grace, marker=self._marker(worker.info.uid),
                                       adopt=worker.adopt, restarts=worker.running.restarts, procfs=self.procfs)
        worker.supervisor = supervisor
        worker.adopt = None
        await self._tg.start(supervisor.run)

    def _ensure_shm(self, allocation: WorkerAllocation) -> None:
        """A soft worker's shared-memory file exists before its process starts: the limiter reads it
        once, at the process's first CUDA call, and a missing file leaves the process unlimited (the
        sync loop alone would create it up to a tick later). `prepare_soft` is the soft-isolation
        service's own `ensure_for`, set by the role."""
        if self.prepare_soft is None or allocation.worker.isolation != ISOLATION_SOFT:
            return
        try:
            self.prepare_soft(allocation)
        except (ShmError, OSError) as exc:
            log.warning("local worker %s/%s starts without its shared-memory file: %s", allocation.worker.namespace,
                        allocation.worker.name, exc)

    def _persist_soon(self) -> None:
        try:
            self._persist()
        except OSError as exc:
            log.warning("cannot persist local workers: %s", exc)

    def _persist(self) -> None:
        records = []
        for worker in sorted(self._workers.values(), key=lambda w: (w.info.namespace, w.info.name)):
            running = self.running_info(worker.info.uid)
            record = worker.info.to_wire(running)
            group = worker.supervisor.group if worker.supervisor is not None else worker.adopt
            if group is not None and record["WorkerRunningInfo"] is not None:
                record["WorkerRunningInfo"]["processGroup"] = group.to_wire()
            records.append(record)
        write_json_atomic(self.state_dir / WORKERS_FILE, records)
