-- Schema v2: typed copies of the node agent's events that the straggler analysis reads.
-- The writer fills both tables in the same transaction as `events` (echo/queries/staging/), so a
-- collective is acknowledged only once it is in both; `events` stays the system of record. The *_key
-- columns are hashes computed once at ingest, so the analysis joins on integers, not strings.
-- Existing stores are backfilled from `events` when this migration is applied.
CREATE TABLE collectives (
    event_id         VARCHAR NOT NULL, -- the row's id in events
    cluster_id       VARCHAR,
    node_id          VARCHAR,
    rank             INTEGER,          -- global rank of the process
    nranks           INTEGER,
    pid              BIGINT,           -- process.pid
    process_start_ns BIGINT,           -- with node_id and pid, identifies one process across pid reuse
    agent_instance   VARCHAR,          -- service.instance.id: one run of one node agent
    tid              BIGINT,           -- the calling thread
    op               VARCHAR,          -- ncclAllReduce, ncclAllGather, ..., ncclSend, ncclRecv
    comm_id          VARCHAR,          -- communicator id as the agent derived it
    seq              BIGINT,           -- sequence number on that communicator, as the agent counted it
    seq_aligned      BOOLEAN,          -- false: the agent attached mid-run and seq counts from attach
    comm_rank        INTEGER,
    comm_nranks      INTEGER,
    bytes            BIGINT,
    in_group         BOOLEAN,          -- enqueued between ncclGroupStart and ncclGroupEnd
    enter_ns         BIGINT NOT NULL,  -- host called the collective (node clock, Unix ns)
    return_ns        BIGINT,           -- the call returned (it only enqueues)
    complete_ns      BIGINT,           -- the sync that waited for it returned; NULL when none did
    causal_chain_id  VARCHAR,          -- <comm_id>:<seq> as sent
    stream_key       UBIGINT,          -- hash of the stream: (cluster, node, process, agent run if unaligned, comm_id)
    inst_key         UBIGINT,          -- hash of the instance (cluster, comm_id, seq); NULL when seq is not aligned
    node_key         UBIGINT,          -- hash of (cluster, node)
    thread_key       UBIGINT           -- hash of (cluster, node, pid, tid): joins host_activity
);
CREATE TABLE host_activity (
    event_id         VARCHAR NOT NULL,
    cluster_id       VARCHAR,
    node_id          VARCHAR,
    rank             INTEGER,
    pid              BIGINT,
    process_start_ns BIGINT,
    tid              BIGINT,
    kind             VARCHAR NOT NULL, -- 'sync' | 'malloc' | 'free' | 'memcpy' | 'offcpu'
    cuda_call        VARCHAR,          -- the CUDA call; for offcpu the traced call in flight ('' = none)
    state            VARCHAR,          -- offcpu only: 'sleeping' (blocked) or 'preempted' (runnable)
    preempted_by     VARCHAR,          -- preempted only: 'job' (a traced process took the CPU) or 'other'
    start_ns         BIGINT NOT NULL,  -- node clock, Unix ns
    end_ns           BIGINT NOT NULL,
    causal_chain_id  VARCHAR,
    thread_key       UBIGINT,          -- hash of (cluster, node, pid, tid), as in collectives
    start_bucket     BIGINT,           -- start_ns // 1e9: lets a time-window join skip whole row groups
    category         VARCHAR           -- what the interval counts as when explaining lateness (staging.sql)
);
