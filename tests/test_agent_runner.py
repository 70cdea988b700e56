"""The agent's batching on its own (no BPF): every point leaves with the resource of its process, even
when the process exited and the tracker retired its resource before the next flush."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankecho.agent.events import FN, CallRecord, ExitRecord, InitRecord
from rankecho.agent.export import Encoded
from rankecho.agent.nvml import SLOWDOWN_MASK, GpuSample
from rankecho.agent.runner import Agent
from rankecho.agent.settings import Settings
from rankecho.shared import contract as c

MS = 1_000_000
UID = b"unique-id".ljust(128, b"\0")


def test_the_last_points_of_an_exited_process_keep_its_rank(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "4242"  # the process as /proc showed it while it ran
    proc.mkdir(parents=True)
    (proc / "stat").write_text("4242 (simrank) S " + " ".join(["0"] * 18) + " 7 0 0\n")  # field 22: start
    (proc / "environ").write_bytes(b"RANK=3\0WORLD_SIZE=8\0")
    spool, proc_root = str(tmp_path / "spool"), str(tmp_path / "proc")
    settings = Settings("127.0.0.1:1", "c", "n", spool_dir=spool, proc_root=proc_root)
    agent = Agent(settings)
    batches: list[Encoded] = []
    agent.exporter.submit = batches.append  # type: ignore[method-assign]
    handle = 0xC0
    init = CallRecord(4242, 4242, FN.COMM_INIT_RANK, 1 * MS, 2 * MS, 0, 8, 3, handle, 0)
    agent.tracker.handle(InitRecord(init, UID))
    agent.tracker.handle(CallRecord(4242, 4242, FN.ALL_REDUCE, 10 * MS, 11 * MS, handle, 0x50, 8, 7, 0))
    agent.tracker.handle(ExitRecord(4242, 20 * MS))  # its pending collective is sent without completion
    agent.tracker.sweep(30 * MS)
    agent.tracker.sweep(40 * MS)  # the second sweep after the exit retires the process's resource
    assert (4242, 7) not in agent.tracker.resources
    agent.flush()
    [batch] = batches
    request = ExportMetricsServiceRequest.FromString(batch.data)
    for rm in request.resource_metrics:
        attrs = {kv.key: kv.value for kv in rm.resource.attributes}
        names = {m.name for sm in rm.scope_metrics for m in sm.metrics}
        if c.M_COLLECTIVE in names:
            assert attrs[c.RANK].int_value == 3 and attrs[c.PROCESS_PID].int_value == 4242
            break
    else:
        raise AssertionError("no collective was sent")


class OneGpu:
    """Stands in for NVML (no GPU on the test machines): one GPU, throttled after its first reading."""

    models, uuids = ["Sim GPU"], ["GPU-0"]

    def __init__(self) -> None:
        self.reads = 0

    def sample(self) -> list[GpuSample]:
        self.reads += 1
        throttle = 0 if self.reads == 1 else SLOWDOWN_MASK
        return [GpuSample(0, "GPU-0", "Sim GPU", 50.0, 1 << 30, 1400, 60, 300.0, throttle)]


def test_gpu_gauges_go_out_every_gpu_interval_while_nvml_is_read_every_window(tmp_path: Path) -> None:
    settings = Settings("127.0.0.1:1", "c", "n", spool_dir=str(tmp_path / "spool"), gpu_interval_s=3600.0)
    agent = Agent(settings)
    gpu = OneGpu()
    agent.gpus.nvml = gpu  # type: ignore[assignment]
    for _ in range(3):
        agent.gpus.sample(agent.tracker.procs.values(), agent._sink)
    assert gpu.reads == 3
    sent = [p.metric_name for _, p in agent.points]
    assert len(sent) == 6 and c.M_GPU_UTIL in sent  # one reading's six gauges, not three
    assert agent.gpus.slowed == {0: True}  # the latest reading still decides the health's throttle flag
