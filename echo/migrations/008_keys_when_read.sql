-- Schema v8: the integer keys the analysis joins on (stream, instance, node, thread) are computed when
-- read, not stored. They are hashes of columns each row already holds; stored, a 64-bit hash does not
-- compress (an instance key cost 9.8 B a collective, the stream and thread keys 3.9 B each: about a
-- quarter of a collective's row). DuckDB's virtual generated columns keep their names and values, so
-- every query reads them as before; nothing can insert into them (staging computes them no more).
-- Each table is rebuilt in this transaction (DuckDB cannot add a generated column to a table), with its
-- columns in the same order.
CREATE TABLE collectives_v8 (
    event_id         VARCHAR NOT NULL,
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
    in_generic       BOOLEAN DEFAULT true
);
INSERT INTO collectives_v8 BY NAME
SELECT * EXCLUDE (stream_key, inst_key, node_key, thread_key) FROM collectives;
DROP TABLE collectives;
ALTER TABLE collectives_v8 RENAME TO collectives;

CREATE TABLE host_activity_v8 (
    event_id         VARCHAR NOT NULL,
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
    in_generic       BOOLEAN DEFAULT true
);
INSERT INTO host_activity_v8 BY NAME SELECT * EXCLUDE (thread_key) FROM host_activity;
DROP TABLE host_activity;
ALTER TABLE host_activity_v8 RENAME TO host_activity;
