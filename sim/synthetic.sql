-- A synthetic training job's agent events, generated in DuckDB (no processes): the benchmark's
-- 10M-event stores and the analysis unit tests, where the truth (clock offsets, sequence shifts,
-- late ranks) is known exactly. Reads two tables the caller registers: syn_ranks (one row per rank:
-- rank, node_id, offset_ns, pid, attach_step, unaligned_from: the step from which the node's agent
-- numbers things its own way, as one that attached or restarted mid-run does, or NULL) and syn_faults
-- (rank, ms, every, start_step, kind). Each step per rank: a loss sync, `buckets` all-reduces on the world
-- communicator, one all-reduce on a tensor-parallel communicator of `tp_size` ranks, a final sync,
-- a copy, off-CPU intervals, a launch count and a health score (16 events with buckets = 2).
-- A 'host' fault makes its rank enter the step's first all-reduce `ms` late (time spent in cudaMalloc);
-- a 'gpu' fault makes its GPU `ms` slower over the step (its loss sync a third of that longer, its host
-- calling that much later); a 'link' fault makes the step's collectives transfer `ms` longer for every
-- rank (a slow link of that rank's: everyone arrives on time and leaves late together); every step of the
-- job waits for its latest rank and its slowest transfer.

-- name: synthetic_events
-- The job's events, with the agent's attribute layout, as the temporary table syn_events.
CREATE OR REPLACE TEMP TABLE syn_events AS
WITH steps AS (SELECT range AS step FROM range($steps)),
delay AS (  -- ms each rank stalls before the step's first all-reduce (host), or its GPU runs long
    SELECT s.step, r.rank, coalesce(max(f.ms) FILTER (WHERE f.kind = 'host'), 0) AS ms,
           coalesce(max(f.ms) FILTER (WHERE f.kind = 'gpu'), 0) AS gpu_ms,
           coalesce(max(f.ms) FILTER (WHERE f.kind = 'link'), 0) AS link_ms
    FROM steps s CROSS JOIN syn_ranks r
    LEFT JOIN syn_faults f
      ON f.rank = r.rank AND s.step >= f.start_step AND (s.step - f.start_step) % f.every = 0
    GROUP BY ALL
),
step_delay AS (  -- a step lasts step_ns, plus its latest rank's stall and slowest transfer, plus jitter
    SELECT step, max(greatest(ms, gpu_ms)) + max(link_ms) AS ms, (hash($seed, step, 'step') % $jitter_ns)::BIGINT AS jitter_ns
    FROM delay GROUP BY step
),
base AS (  -- true start of each step: every stall delays the rest of the job
    SELECT step, ms AS worst_ms, jitter_ns AS step_jitter_ns,
           $t0 + step * $step_ns
             + CAST(coalesce(sum(ms * 1e6 + jitter_ns)
                                 OVER (ORDER BY step ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                    AS BIGINT) AS start_ns
    FROM step_delay
),
sr AS (
    SELECT b.step, b.start_ns, b.worst_ms, r.*, d.ms AS late_ms,
           (hash($seed, b.step, r.rank) % 1000000)::BIGINT AS jitter_ns,
           b.start_ns + CAST(0.3 * $step_ns + d.gpu_ms * 1e6 / 3 AS BIGINT) AS fwd_done_ns,
           b.start_ns + CAST(0.95 * $step_ns + b.worst_ms * 1e6 AS BIGINT) + b.step_jitter_ns
             + (hash($seed, b.step, r.rank, 'done') % 1000000)::BIGINT AS done_ns
    FROM base b CROSS JOIN syn_ranks r JOIN delay d ON d.step = b.step AND d.rank = r.rank
    WHERE b.step >= r.attach_step
),
calls AS (  -- the collectives: world buckets 0..buckets-1, then the tp all-reduce
    SELECT sr.*, k.k AS call,
           k.k < $buckets AS world,
           sr.fwd_done_ns + 500000 + CAST(sr.late_ms * 1e6 AS BIGINT) + sr.jitter_ns + k.k * 300000 AS enter_ns
    FROM sr CROSS JOIN (SELECT range AS k FROM range($buckets + 1)) k
),
numbered AS (
    SELECT *,
           CASE WHEN world THEN step * $buckets + call ELSE step END AS seq,
           CASE WHEN world THEN 'world' ELSE 'tp' || (rank // $tp_size) END AS comm_name,
           CASE WHEN world THEN rank ELSE rank % $tp_size END AS comm_rank,
           CASE WHEN world THEN (SELECT count(*) FROM syn_ranks) ELSE $tp_size END AS comm_nranks,
           CASE WHEN world THEN 16777216 ELSE 4194304 END AS bytes
    FROM calls
),
own AS (SELECT *, coalesce(step >= unaligned_from, false) AS unaligned FROM numbered),
agent_view AS (  -- what the node's agent calls them: after an attach or restart mid-run, its own
    -- communicator ids (by the order the process used them: world first on even ranks, tp first on odd
    -- ones) and sequences counted from then
    SELECT *,
           CASE WHEN NOT unaligned THEN 'c-' || comm_name
                ELSE 'attached-' || CASE WHEN (rank % 2 = 0) = world THEN 0 ELSE 1 END END AS comm_id,
           seq - CASE WHEN NOT unaligned THEN 0
                      WHEN world THEN unaligned_from * $buckets ELSE unaligned_from END AS agent_seq,
           'agent-' || node_id || CASE WHEN unaligned THEN '-from-' || unaligned_from ELSE '' END AS agent
    FROM own
),
collective_events AS (
    SELECT step, rank, node_id, offset_ns, 'c' || call AS what, enter_ns AS ts,
           (done_ns - enter_ns) / 1e6 AS value,
           json_object('process.pid', pid, 'rankecho.process.start_ns', 1000, 'service.instance.id', agent,
                       'thread.id', pid, 'rankecho.nccl.op', 'ncclAllReduce', 'rankecho.nccl.comm_id', comm_id,
                       'rankecho.nccl.seq', agent_seq, 'rankecho.nccl.seq_aligned', NOT unaligned,
                       'rankecho.nccl.comm_rank', comm_rank, 'rankecho.nccl.comm_nranks', comm_nranks,
                       'rankecho.bytes', bytes, 'rankecho.enter_ns', enter_ns + offset_ns,
                       'rankecho.return_ns', enter_ns + offset_ns + 20000, 'rankecho.complete_ns', done_ns + offset_ns,
                       'causal_chain_id', comm_id || ':' || agent_seq) AS attrs,
           'rankecho.nccl.collective' AS metric, comm_id || ':' || agent_seq AS chain
    FROM agent_view
),
activity AS (  -- loss sync, final sync, copy, a stall in cudaMalloc, sleeping intervals
    SELECT step, rank, node_id, offset_ns, pid, 'sync0' AS what, 'rankecho.cuda.sync' AS metric,
           start_ns + 1000000 AS ts, fwd_done_ns - start_ns - 1000000 AS dur_ns, 'cudaStreamSynchronize' AS call,
           NULL AS state
    FROM sr
    UNION ALL
    SELECT step, rank, node_id, offset_ns, pid, 'sync1', 'rankecho.cuda.sync',
           fwd_done_ns + 500000 + CAST(late_ms * 1e6 AS BIGINT) + jitter_ns + ($buckets + 1) * 300000,
           done_ns - (fwd_done_ns + 500000 + CAST(late_ms * 1e6 AS BIGINT) + jitter_ns + ($buckets + 1) * 300000),
           'cudaStreamSynchronize', NULL
    FROM sr
    UNION ALL
    SELECT step, rank, node_id, offset_ns, pid, 'copy', 'rankecho.cuda.memcpy', start_ns + 500000, 20000,
           'cudaMemcpyAsync', NULL
    FROM sr
    UNION ALL
    SELECT step, rank, node_id, offset_ns, pid, 'malloc', 'rankecho.cuda.malloc', fwd_done_ns + 400000,
           CAST(late_ms * 1e6 AS BIGINT), 'cudaMalloc', NULL
    FROM sr WHERE late_ms > 0
    UNION ALL
    SELECT step, rank, node_id, offset_ns, pid, 'off' || k.k, 'rankecho.sched.offcpu',
           start_ns + 100000 + k.k * CAST($step_ns / 10 AS BIGINT), 1000000,
           CASE WHEN k.k < 3 THEN 'cudaStreamSynchronize' ELSE '' END, 'sleeping'
    FROM sr CROSS JOIN (SELECT range AS k FROM range(8)) k
),
activity_events AS (
    SELECT step, rank, node_id, offset_ns, what, ts, dur_ns / 1e6 AS value,
           CASE WHEN metric = 'rankecho.sched.offcpu'
                THEN json_object('process.pid', pid, 'rankecho.process.start_ns', 1000, 'thread.id', pid,
                                 'rankecho.sched.state', state, 'rankecho.call_in_flight', call)
                ELSE json_object('process.pid', pid, 'rankecho.process.start_ns', 1000, 'thread.id', pid,
                                 'rankecho.cuda.call', call, 'rankecho.enter_ns', ts + offset_ns,
                                 'rankecho.return_ns', ts + dur_ns + offset_ns) END AS attrs,
           metric, NULL AS chain
    FROM activity
),
step_events AS (
    SELECT step, rank, node_id, offset_ns, 'launch' AS what, done_ns AS ts, NULL AS value,
           json_object('process.pid', pid, 'thread.id', pid) AS attrs, 'rankecho.cuda.kernel_launches' AS metric,
           NULL AS chain
    FROM sr
    UNION ALL
    SELECT step, rank, node_id, offset_ns, 'health', done_ns, CASE WHEN late_ms > 0 THEN 0.3 ELSE 1.0 END,
           json_object('process.pid', pid), 'rankecho.health.score', NULL
    FROM sr
),
everything AS (
    SELECT * FROM collective_events UNION ALL SELECT * FROM activity_events UNION ALL SELECT * FROM step_events
)
SELECT 'syn/' || node_id || '/' || rank || '/' || step || '/' || what AS event_id,
       ts + offset_ns AS timestamp_ns, ts + offset_ns AS received_ns, 'metric' AS signal,
       $cluster AS cluster_id, node_id, metric AS metric_name, rank, (SELECT count(*) FROM syn_ranks) AS nranks,
       CASE WHEN metric = 'rankecho.cuda.kernel_launches' THEN NULL ELSE value END AS value_double,
       CASE WHEN metric = 'rankecho.cuda.kernel_launches' THEN 40 END AS value_int,
       chain AS causal_chain_id, CAST(attrs AS VARCHAR) AS attrs_json
FROM everything;

-- name: stamp_synthetic_job
-- Give syn_events a job: rankecho.job.id $job in every event's attributes, as the agent stamps it, and
-- the job in the event id (two jobs' events are two sets of events).
UPDATE syn_events
SET event_id = $job || '/' || event_id,
    attrs_json = CAST(json_merge_patch(attrs_json, json_object('rankecho.job.id', $job)) AS VARCHAR);
