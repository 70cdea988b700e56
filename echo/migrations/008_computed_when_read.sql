-- Schema v8: what a typed row can compute from its own columns is computed when read, not stored.
-- - The integer keys the analysis joins on (stream, instance, node, thread): hashes of the row's columns;
--   stored, a 64-bit hash does not compress (an instance key cost 9.8 B a collective, the stream and
--   thread keys 3.9 B each: about a quarter of a collective's row).
-- - The event id: the node agent's id of a traced process's point is MD5 over what the point carries
--   (shared/contract.py `event_id`), so a row whose id is that stores none (`event_id_sent` NULL); any
--   other id (other producers, older agents, the 'runq' piece of an off-CPU interval) is stored as sent.
-- DuckDB's virtual generated columns keep the names and values, so every query reads them as before;
-- nothing can insert into them. Each table is rebuilt in this transaction (DuckDB cannot add a generated
-- column to a table), with its columns in the same order and `event_id_sent` last.
CREATE TABLE collectives_v8 (
    event_id         VARCHAR AS (coalesce(event_id_sent, left(md5(concat_ws(chr(31), coalesce(CAST(node_id AS VARCHAR), ''), coalesce(CAST(pid AS VARCHAR), ''),
                 coalesce(CAST(process_start_ns AS VARCHAR), ''), 'rankecho.nccl.collective',
                 coalesce(CAST(tid AS VARCHAR), ''), CAST(enter_ns AS VARCHAR),
                 coalesce(causal_chain_id, ''))), 16))) VIRTUAL,
    cluster_id       VARCHAR,
    node_id          VARCHAR,
    rank             INTEGER,
    nranks           INTEGER,
    pid              BIGINT,
    process_start_ns BIGINT,
    agent_instance   VARCHAR,
    tid              BIGINT,
    op               VARCHAR,
    comm_id          VARCHAR,
    seq              BIGINT,
    seq_aligned      BOOLEAN,
    comm_rank        INTEGER,
    comm_nranks      INTEGER,
    bytes            BIGINT,
    in_group         BOOLEAN,
    enter_ns         BIGINT NOT NULL,
    return_ns        BIGINT,
    complete_ns      BIGINT,
    causal_chain_id  VARCHAR,
    -- the stream: one process's calls on one communicator, as one agent run numbered them when unaligned
    stream_key       UBIGINT AS (hash(cluster_id, node_id, pid, process_start_ns,
                                      CASE WHEN seq_aligned THEN '' ELSE agent_instance END, comm_id)) VIRTUAL,
    -- the instance, when the agent saw the communicator created (seq aligned across ranks)
    inst_key         UBIGINT AS (CASE WHEN seq_aligned AND seq IS NOT NULL
                                      THEN hash(cluster_id, comm_id, seq) END) VIRTUAL,
    node_key         UBIGINT AS (hash(cluster_id, node_id)) VIRTUAL,
    thread_key       UBIGINT AS (hash(cluster_id, node_id, pid, tid)) VIRTUAL,  -- joins host_activity
    pre_window_ns    BIGINT,
    pre_allocator_ns BIGINT,
    pre_slow_gpu_ns  BIGINT,
    pre_memcpy_ns    BIGINT,
    pre_cpu_contention_ns BIGINT,
    pre_sleeping_ns  BIGINT,
    pre_presync_ns   BIGINT,
    launches         BIGINT,
    job_id           VARCHAR DEFAULT '',
    stack_id         VARCHAR,
    pre_allocator_stack VARCHAR,
    pre_slow_gpu_stack VARCHAR,
    pre_memcpy_stack VARCHAR,
    pre_cpu_contention_stack VARCHAR,
    pre_sleeping_stack VARCHAR,
    pre_oncpu_stack  VARCHAR,
    pre_oncpu_samples BIGINT,
    received_ns      BIGINT,
    attrs_id         INTEGER,
    in_generic       BOOLEAN DEFAULT true,
    event_id_sent    VARCHAR   -- the id as sent, when it is not the one event_id computes (else NULL)
);
INSERT INTO collectives_v8 BY NAME
SELECT * EXCLUDE (event_id, stream_key, inst_key, node_key, thread_key), event_id AS event_id_sent
FROM collectives;
DROP TABLE collectives;
ALTER TABLE collectives_v8 RENAME TO collectives;

CREATE TABLE host_activity_v8 (
    event_id         VARCHAR AS (coalesce(event_id_sent, left(md5(concat_ws(chr(31), coalesce(CAST(node_id AS VARCHAR), ''), coalesce(CAST(pid AS VARCHAR), ''),
                 coalesce(CAST(process_start_ns AS VARCHAR), ''), coalesce(CASE kind WHEN 'sync' THEN 'rankecho.cuda.sync' WHEN 'malloc' THEN 'rankecho.cuda.malloc' WHEN 'free' THEN 'rankecho.cuda.free' WHEN 'memcpy' THEN 'rankecho.cuda.memcpy' WHEN 'offcpu' THEN 'rankecho.sched.offcpu' END, ''),
                 coalesce(CAST(tid AS VARCHAR), ''), CAST(start_ns AS VARCHAR),
                 coalesce(causal_chain_id, ''))), 16))) VIRTUAL,
    cluster_id       VARCHAR,
    node_id          VARCHAR,
    rank             INTEGER,
    pid              BIGINT,
    process_start_ns BIGINT,
    tid              BIGINT,
    kind             VARCHAR NOT NULL,
    cuda_call        VARCHAR,
    state            VARCHAR,
    preempted_by     VARCHAR,
    start_ns         BIGINT NOT NULL,
    end_ns           BIGINT NOT NULL,
    causal_chain_id  VARCHAR,
    thread_key       UBIGINT AS (hash(cluster_id, node_id, pid, tid)) VIRTUAL,  -- as in collectives
    start_bucket     BIGINT,
    category         VARCHAR,
    job_id           VARCHAR DEFAULT '',
    stack_id         VARCHAR,
    nranks           INTEGER,
    received_ns      BIGINT,
    value_double     DOUBLE,
    runq_ms          DOUBLE,
    bytes            BIGINT,
    attrs_id         INTEGER,
    in_generic       BOOLEAN DEFAULT true,
    event_id_sent    VARCHAR   -- as in collectives
);
INSERT INTO host_activity_v8 BY NAME
SELECT * EXCLUDE (event_id, thread_key), event_id AS event_id_sent FROM host_activity;
DROP TABLE host_activity;
ALTER TABLE host_activity_v8 RENAME TO host_activity;
