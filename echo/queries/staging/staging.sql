-- How the writer copies the node agent's events into the typed analysis tables (schema v2; v7: the typed
-- row is the event's only copy when it rebuilds exactly, see echo/store/typed_events.py).
-- Each statement reads the relation `staged`: the rows of one commit that were new to the store (the
-- writer registers them), or every stored event when a migration backfills an older store, and writes
-- the temporary `staging_*` table of its target; the writer then decides per row whether the typed row
-- is the event's only copy (echo/store/staging.py) and moves the rows into the store.
-- Attributes are read once per row with a list of JSON paths; a malformed value becomes NULL.

-- name: rk_ms_to_ns
-- A millisecond attribute (text, as json_extract_string returns it) as integer ns; malformed = NULL.
CREATE OR REPLACE TEMP MACRO rk_ms_to_ns(ms) AS (CAST(round(TRY_CAST(ms AS DOUBLE) * 1e6) AS BIGINT));

-- name: stage_collectives
-- One row per rankecho.nccl.collective point (collectives and send/recv), with its pre-call window's
-- breakdown when the agent summarised it (pre_*: ms attributes as ns). The integer keys the analysis
-- joins on (stream, instance, node, thread) are computed when read (schema v8, generated columns).
INSERT INTO staging_collectives BY NAME
SELECT *
FROM (
SELECT event_id, cluster_id, node_id, rank, nranks, received_ns,
       TRY_CAST(a[1] AS BIGINT) AS pid,
       TRY_CAST(a[2] AS BIGINT) AS process_start_ns,
       a[3] AS agent_instance,
       TRY_CAST(a[4] AS BIGINT) AS tid,
       a[5] AS op,
       a[6] AS comm_id,
       TRY_CAST(a[7] AS BIGINT) AS seq,
       coalesce(TRY_CAST(a[8] AS BOOLEAN), false) AS seq_aligned,
       TRY_CAST(a[9] AS INTEGER) AS comm_rank,
       TRY_CAST(a[10] AS INTEGER) AS comm_nranks,
       TRY_CAST(a[11] AS BIGINT) AS bytes,
       coalesce(TRY_CAST(a[12] AS BOOLEAN), false) AS in_group,
       coalesce(TRY_CAST(a[13] AS BIGINT), timestamp_ns) AS enter_ns,
       TRY_CAST(a[14] AS BIGINT) AS return_ns,
       TRY_CAST(a[15] AS BIGINT) AS complete_ns,
       causal_chain_id,
       rk_ms_to_ns(a[16]) AS pre_window_ns,
       CASE WHEN a[16] IS NOT NULL THEN coalesce(rk_ms_to_ns(a[17]), 0) END AS pre_allocator_ns,
       CASE WHEN a[16] IS NOT NULL THEN coalesce(rk_ms_to_ns(a[18]), 0) END AS pre_slow_gpu_ns,
       CASE WHEN a[16] IS NOT NULL THEN coalesce(rk_ms_to_ns(a[19]), 0) END AS pre_memcpy_ns,
       CASE WHEN a[16] IS NOT NULL THEN coalesce(rk_ms_to_ns(a[20]), 0) END AS pre_cpu_contention_ns,
       CASE WHEN a[16] IS NOT NULL THEN coalesce(rk_ms_to_ns(a[21]), 0) END AS pre_sleeping_ns,
       rk_ms_to_ns(a[22]) AS pre_presync_ns,
       TRY_CAST(a[23] AS BIGINT) AS launches,
       coalesce(a[24], '') AS job_id,
       a[25] AS stack_id,
       a[26] AS pre_allocator_stack,
       a[27] AS pre_slow_gpu_stack,
       a[28] AS pre_memcpy_stack,
       a[29] AS pre_cpu_contention_stack,
       a[30] AS pre_sleeping_stack,
       a[31] AS pre_oncpu_stack,
       TRY_CAST(a[32] AS BIGINT) AS pre_oncpu_samples
FROM (
    SELECT *,
           json_extract_string(attrs_json, [
               '$."process.pid"', '$."rankecho.process.start_ns"', '$."service.instance.id"',
               '$."thread.id"', '$."rankecho.nccl.op"', '$."rankecho.nccl.comm_id"',
               '$."rankecho.nccl.seq"', '$."rankecho.nccl.seq_aligned"', '$."rankecho.nccl.comm_rank"',
               '$."rankecho.nccl.comm_nranks"', '$."rankecho.bytes"', '$."rankecho.nccl.in_group"',
               '$."rankecho.enter_ns"', '$."rankecho.return_ns"', '$."rankecho.complete_ns"',
               '$."rankecho.pre.window_ms"', '$."rankecho.pre.allocator_ms"', '$."rankecho.pre.slow_gpu_ms"',
               '$."rankecho.pre.memcpy_ms"', '$."rankecho.pre.cpu_contention_ms"',
               '$."rankecho.pre.sleeping_ms"', '$."rankecho.pre.presync_ms"', '$."rankecho.cuda.launches"',
               '$."rankecho.job.id"', '$."rankecho.stack.id"', '$."rankecho.pre.allocator_stack"',
               '$."rankecho.pre.slow_gpu_stack"', '$."rankecho.pre.memcpy_stack"',
               '$."rankecho.pre.cpu_contention_stack"', '$."rankecho.pre.sleeping_stack"',
               '$."rankecho.pre.oncpu_stack"', '$."rankecho.pre.oncpu_samples"'
           ]) AS a
    FROM staged
    WHERE metric_name = 'rankecho.nccl.collective'
)
);

-- name: stage_host_activity
-- One row per interval a rank's thread spent in a CUDA call or off the CPU: the evidence of what a
-- late rank did before it entered a collective. The interval ends value_double ms after it started.
-- Its category, decided once here, is what it counts as when explaining lateness: 'allocator'
-- (cudaMalloc/cudaFree), 'slow_gpu' (blocked in its own sync: its GPU was busy), 'memcpy' (a copy),
-- 'cpu_contention' (off the CPU while runnable, pushed off by another workload), 'sleeping' (off the
-- CPU, blocked, outside a CUDA call: data loader, I/O, locks); NULL for an off-CPU interval inside
-- one of those calls (the call's own interval already counts it) and for one where a thread of a
-- traced process took the CPU (the node's ranks competing for its cores: host compute, like what no
-- interval covers).
-- A blocked thread that was woken and then waited in the run queue behind another workload
-- (runq_ms > 0, preempted_by 'other') was two things in turn: asleep, then kept off a busy CPU. Its
-- interval is split: the sleep up to the wakeup, and a 'runq' row for the wait (event_id + '/runq')
-- that counts as cpu_contention outside CUDA calls; inside a sync it stays uncategorised (the sync
-- counts it) but lets the GPU rule take out the part of a long sync that was the CPU's fault.
INSERT INTO staging_host_activity BY NAME
WITH parsed AS (
SELECT event_id, cluster_id, node_id, rank, nranks, received_ns, value_double,
       TRY_CAST(a[1] AS BIGINT) AS pid,
       TRY_CAST(a[2] AS BIGINT) AS process_start_ns,
       TRY_CAST(a[3] AS BIGINT) AS tid,
       CASE metric_name
           WHEN 'rankecho.cuda.sync' THEN 'sync'
           WHEN 'rankecho.cuda.malloc' THEN 'malloc'
           WHEN 'rankecho.cuda.free' THEN 'free'
           WHEN 'rankecho.cuda.memcpy' THEN 'memcpy'
           ELSE 'offcpu'
       END AS kind,
       coalesce(a[4], a[5]) AS cuda_call,
       a[6] AS state,
       a[7] AS preempted_by,
       timestamp_ns AS start_ns,
       timestamp_ns + CAST(round(greatest(coalesce(value_double, 0), 0) * 1e6) AS BIGINT) AS end_ns,
       causal_chain_id,
       CASE WHEN metric_name = 'rankecho.sched.offcpu' AND a[6] = 'sleeping' AND a[7] = 'other'
            THEN CAST(round(least(greatest(coalesce(TRY_CAST(a[8] AS DOUBLE), 0), 0),
                                  greatest(coalesce(value_double, 0), 0)) * 1e6) AS BIGINT)
            ELSE 0 END AS runq_ns,
       coalesce(a[9], '') AS job_id,
       a[10] AS stack_id,
       TRY_CAST(a[8] AS DOUBLE) AS runq_ms,
       TRY_CAST(a[11] AS BIGINT) AS bytes
FROM (
    SELECT *,
           json_extract_string(attrs_json, [
               '$."process.pid"', '$."rankecho.process.start_ns"', '$."thread.id"',
               '$."rankecho.cuda.call"', '$."rankecho.call_in_flight"', '$."rankecho.sched.state"',
               '$."rankecho.sched.preempted_by"', '$."rankecho.sched.runq_ms"', '$."rankecho.job.id"',
               '$."rankecho.stack.id"', '$."rankecho.bytes"'
           ]) AS a
    FROM staged
    WHERE metric_name IN ('rankecho.cuda.sync', 'rankecho.cuda.malloc', 'rankecho.cuda.free',
                          'rankecho.cuda.memcpy', 'rankecho.sched.offcpu')
      AND value_double IS NOT NULL AND value_double < 3.6e6
)
),
pieces AS (  -- the interval (less its run-queue wait when split) and the wait as a row of its own
    SELECT * EXCLUDE (runq_ns, end_ns), end_ns - runq_ns AS end_ns FROM parsed
    UNION ALL BY NAME
    SELECT * EXCLUDE (event_id, kind, start_ns, end_ns, runq_ns), event_id || '/runq' AS event_id,
           'runq' AS kind, end_ns - runq_ns AS start_ns, end_ns
    FROM parsed WHERE runq_ns > 0
)
SELECT event_id, cluster_id, node_id, rank, nranks, received_ns, value_double, pid, process_start_ns, tid,
       kind, cuda_call, state, preempted_by, start_ns, end_ns, causal_chain_id, job_id, stack_id, runq_ms, bytes,
       start_ns // 1000000000 AS start_bucket,
       CASE WHEN kind IN ('malloc', 'free') THEN 'allocator'
            WHEN kind = 'sync' THEN 'slow_gpu'
            WHEN kind = 'memcpy' THEN 'memcpy'
            WHEN cuda_call IN ('cudaMalloc', 'cudaFree', 'cudaMemcpy', 'cudaStreamSynchronize',
                               'cudaDeviceSynchronize', 'cudaEventSynchronize') THEN NULL
            WHEN kind = 'runq' THEN 'cpu_contention'
            WHEN state = 'preempted' AND preempted_by = 'job' THEN NULL
            WHEN state = 'preempted' THEN 'cpu_contention'
            ELSE 'sleeping' END AS category
FROM pieces;

-- name: stage_stacks
-- One row per distinct stack id of the commit's rankecho.stack points (schema v6): frames split back
-- into a list (innermost first), the first point's time and node. An id already stored keeps its row: the
-- id is a content hash, so a second node's point (or a restarted agent's) carries the same frames.
INSERT OR IGNORE INTO stacks BY NAME
SELECT DISTINCT ON (stack_id) stack_id, frames, len(frames) AS depth, truncated, first_seen_ns, cluster_id, node_id
FROM (
    SELECT a[1] AS stack_id, string_split(a[2], chr(10)) AS frames,
           coalesce(TRY_CAST(a[3] AS BOOLEAN), false) AS truncated,
           timestamp_ns AS first_seen_ns, cluster_id, node_id
    FROM (
        SELECT *, json_extract_string(attrs_json, [
                   '$."rankecho.stack.id"', '$."rankecho.stack.frames"', '$."rankecho.stack.truncated"'
               ]) AS a
        FROM staged
        WHERE metric_name = 'rankecho.stack'
    )
)
WHERE stack_id IS NOT NULL AND frames IS NOT NULL AND frames <> ['']
ORDER BY stack_id, first_seen_ns;
