"""Job identity from a traced process's environment: one test per rule, generations, and the tracker
stamping ``rankecho.job.id`` / ``rankecho.job.source`` on every point of a process (no kernel)."""

from __future__ import annotations

from pathlib import Path

from rankecho.agent.clock import ClockConverter
from rankecho.agent.events import FN, CallRecord, ExitRecord
from rankecho.agent.identity import ProcessInfo, env_identity, read_process
from rankecho.agent.jobid import JobEnv, JobIds, from_env, stamp
from rankecho.agent.tracker import Tracker
from rankecho.shared import contract as c

S = 1_000_000_000
T0 = 1_765_000_000 * S  # 2025-12-06T05:46:40Z
TORCH = {"RANK": "0", "WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_explicit_override_wins_over_every_launcher() -> None:
    env = {**TORCH, "RANKECHO_JOB_ID": "llama-70b-run3", "TORCHELASTIC_RUN_ID": "r1", "SLURM_JOB_ID": "9"}
    assert from_env(env) == JobEnv("llama-70b-run3", "explicit")


def test_torchelastic_run_id_and_torchruns_default_none_is_skipped() -> None:
    assert from_env({**TORCH, "TORCHELASTIC_RUN_ID": "r1", "SLURM_JOB_ID": "9"}) == \
        JobEnv("torchelastic:r1", "torchelastic")
    # torchrun without --rdzv-id sets "none" on every job: no identity, the next rule decides.
    assert from_env({**TORCH, "TORCHELASTIC_RUN_ID": "none"}).source == "rendezvous"


def test_slurm_job_id_with_and_without_cluster() -> None:
    assert from_env({**TORCH, "SLURM_JOB_ID": "4242"}) == JobEnv("slurm:4242", "slurm")
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_CLUSTER_NAME": "eos"}
    assert from_env(slurm) == JobEnv("slurm:eos/4242", "slurm")


def test_kubernetes_owner_from_env_or_otel_resource_attributes() -> None:
    jobset = {**TORCH, "JOBSET_NAME": "train", "JOBSET_UID": "u-1", "K8S_NAMESPACE_NAME": "ml"}
    assert from_env(jobset) == JobEnv("k8s:ml/JobSet/train/u-1", "k8s")
    assert from_env({"PYTORCHJOB_NAME": "bert"}) == JobEnv("k8s:PyTorchJob/bert", "k8s")
    otel = {"OTEL_RESOURCE_ATTRIBUTES": "k8s.job.name=ft%2Dx,k8s.job.uid=abc", "POD_NAMESPACE": "t"}
    assert from_env(otel) == JobEnv("k8s:t/Job/ft-x/abc", "k8s")
    assert from_env({"OTEL_RESOURCE_ATTRIBUTES": "broken", **TORCH}).source == "rendezvous"


def test_rendezvous_and_local_fallback_need_a_start_time() -> None:
    assert from_env(TORCH) == JobEnv("10.0.0.1:29500", "rendezvous")
    assert from_env({"RANK": "1"}, world_size=4) == JobEnv("world=4", "local")
    assert from_env({}) == JobEnv("world=?", "local")
    assert stamp(T0 + 123_456_789) == "2025-12-06T05:46:40.123Z" and stamp(0) == "?"


def test_rendezvous_generations_one_job_while_ranks_live_next_job_after_an_exit() -> None:
    ids, rdzv = JobIds("n1"), JobEnv("10.0.0.1:29500", "rendezvous")
    first = ids.job_of((1, 10), rdzv, T0)
    assert first.id == "10.0.0.1:29500@2025-12-06T05:46:40.000Z" and first.source == "rendezvous"
    assert ids.job_of((2, 11), rdzv, T0 + S // 2) == first  # a second rank of the same job
    ids.exited((1, 10), T0 + 60 * S)
    # A rank restarted under a new pid before every rank exited, but after the first exit: new job.
    second = ids.job_of((3, 12), rdzv, T0 + 61 * S)
    assert second.id.endswith("05:47:41.000Z") and second != first
    assert ids.job_of((2, 11), rdzv, T0 + S // 2) == first  # a live process keeps its id
    # A job on another port at the same time is another job.
    assert ids.job_of((4, 13), JobEnv("10.0.0.1:29600", "rendezvous"), T0).id.startswith("10.0.0.1:29600@")
    # Ids that need no generation pass through.
    assert ids.job_of((5, 14), JobEnv("slurm:1", "slurm"), T0).id == "slurm:1"
    ids.exited((2, 11), T0 + 62 * S)
    ids.forget((1, 10))
    ids.forget((2, 11))
    assert ids.job_of((6, 15), rdzv, T0 + 61 * S + 1) == second  # joins the live second generation


def test_local_fallback_is_per_node() -> None:
    job = JobIds("gpu-7").job_of((1, 1), JobEnv("world=2", "local"), T0)
    assert job.id == "local:gpu-7/world=2@2025-12-06T05:46:40.000Z" and job.source == "local"


def test_read_process_parses_the_job_rule_from_environ(tmp_path: Path) -> None:
    proc = tmp_path / "42"
    proc.mkdir()
    (proc / "stat").write_text("42 (python) S " + " ".join(str(i) for i in range(4, 60)))
    (proc / "environ").write_bytes(b"RANK=1\0WORLD_SIZE=2\0SLURM_JOB_ID=77\0")
    info = read_process(str(tmp_path), 42)
    assert info is not None and info.env.job == JobEnv("slurm:77", "slurm")
    assert env_identity({}).job == JobEnv("world=?", "local")


def test_tracker_stamps_the_job_on_every_process_and_a_restart_gets_a_new_job() -> None:
    points: list[tuple[object, object]] = []
    env = env_identity(TORCH)
    infos = {100: ProcessInfo(100, 7, env, start_ns=T0), 101: ProcessInfo(101, 9, env, start_ns=T0 + S)}
    clock = ClockConverter(realtime=lambda: T0, monotonic=lambda: 0)
    t = Tracker("node-a", clock, infos.get, lambda k, p: points.append((k, p)))
    t.handle(CallRecord(100, 100, FN.MALLOC, 1000, 2000, 64, 0, 0, 0, 0))
    res = t.resources[(100, 7)]
    assert res[c.JOB_ID] == "10.0.0.1:29500@2025-12-06T05:46:40.000Z" and res[c.JOB_SOURCE] == "rendezvous"
    t.handle(ExitRecord(100, 5000))
    infos[101] = ProcessInfo(101, 9, env, start_ns=T0 + 10**12)  # started long after rank 0's exit
    t.handle(CallRecord(101, 101, FN.MALLOC, 6000, 7000, 64, 0, 0, 0, 0))
    assert t.resources[(101, 9)][c.JOB_ID] == "10.0.0.1:29500@2025-12-06T06:03:20.000Z"
