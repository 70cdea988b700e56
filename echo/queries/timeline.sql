-- The cross-rank timeline a person looks at (rankecho report, rankecho export-trace) and an AI agent
-- reads (fleet.cluster.timeline): the analysis layers' own rows (rk_lateness), on the reference clock,
-- never a second derivation of who was late. $start_ns / $end_ns: the analysis window (the noise and
-- the threshold come from it, as in find_stragglers); $from_ns / $to_ns: the part of it drawn
-- (reference clock); $cluster_id, $node_id, $rank NULL = every one; $job_id (optional) NULL = every job.

-- name: timeline_slices
-- One row per slice in [$from_ns, $to_ns), per (node, rank) lane, on the reference clock (start_ns, end_ns):
-- kind 'collective' (enter -> the instance's completion, with its causal_chain_id, step, lateness and
-- whether the rank was late), 'wait' (an on-time rank inside the collective until the last rank
-- arrived: the wait a straggler imposed), 'prewindow' (a late rank's $before_ms before its first late
-- call of the step: what explain_straggler looks at), and the rank's host activity: 'sync', 'malloc', 'free', 'memcpy',
-- 'offcpu' (state: sleeping or preempted). Clipped to the range; at most $max_rows, earliest first.
WITH l AS MATERIALIZED (
    SELECT * FROM rk_lateness($start_ns, $end_ns, $cluster_id, job := $job_id)
    WHERE ($node_id IS NULL OR node_id = $node_id) AND ($rank IS NULL OR rank = $rank)
      AND enter_c - $before_ms * 1e6 < $to_ns AND greatest(done_c, enter_c) >= $from_ns
),
inst AS (SELECT inst_key, max(enter_c) AS last_c FROM l GROUP BY ALL),
lanes AS (  -- each rank's thread, with its node's clock offset (subtracted from node-clock times)
    SELECT DISTINCT cluster_id, node_id, rank, pid, tid, thread_key, clock_offset_ns FROM l
),
collective AS (
    SELECT l.cluster_id, l.node_id, l.rank, l.pid, l.tid, 'collective' AS kind,
           CAST(l.enter_c AS BIGINT) AS start_ns, CAST(greatest(l.done_c, l.enter_c) AS BIGINT) AS end_ns,
           l.comm_key || ':' || l.seq_g AS causal_chain_id, l.step,
           l.host_late_ns / 1e6 AS late_ms, l.gpu_late_ns / 1e6 AS gpu_late_ms,
           (l.host_late OR l.gpu_late_ns IS NOT NULL) AS late, NULL AS state, NULL AS cuda_call
    FROM l
),
wait AS (
    SELECT l.cluster_id, l.node_id, l.rank, l.pid, l.tid, 'wait' AS kind,
           CAST(l.enter_c AS BIGINT) AS start_ns, CAST(i.last_c AS BIGINT) AS end_ns,
           l.comm_key || ':' || l.seq_g AS causal_chain_id, l.step,
           (i.last_c - l.enter_c) / 1e6 AS late_ms, NULL AS gpu_late_ms, false AS late,
           NULL AS state, NULL AS cuda_call
    FROM l JOIN inst i USING (inst_key)
    WHERE NOT l.host_late AND l.gpu_late_ns IS NULL AND i.last_c - l.enter_c >= l.threshold_ns
),
prewindow AS (
    SELECT l.cluster_id, l.node_id, l.rank, l.pid, l.tid, 'prewindow' AS kind,
           CAST(l.enter_c - $before_ms * 1e6 AS BIGINT) AS start_ns, CAST(l.enter_c AS BIGINT) AS end_ns,
           l.comm_key || ':' || l.seq_g AS causal_chain_id, l.step,
           greatest(l.host_late_ns, coalesce(l.gpu_late_ns, 0)) / 1e6 AS late_ms, l.gpu_late_ns / 1e6 AS gpu_late_ms,
           true AS late, NULL AS state, NULL AS cuda_call
    FROM l
    WHERE l.host_late OR l.gpu_late_ns IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY l.cluster_id, l.node_id, l.rank, l.step ORDER BY l.enter_c) = 1
),
activity AS (
    SELECT n.cluster_id, n.node_id, n.rank, n.pid, n.tid, h.kind,
           CAST(h.start_ns - n.clock_offset_ns AS BIGINT) AS start_ns,
           CAST(h.end_ns - n.clock_offset_ns AS BIGINT) AS end_ns,
           h.causal_chain_id, NULL AS step, NULL AS late_ms, NULL AS gpu_late_ms, NULL AS late,
           h.state, nullif(h.cuda_call, '') AS cuda_call
    FROM lanes n
    JOIN host_activity h
      ON h.thread_key = n.thread_key
     AND h.start_bucket BETWEEN ($from_ns + n.clock_offset_ns) // 1000000000 - 60
                            AND ($to_ns + n.clock_offset_ns) // 1000000000
     AND h.end_ns - n.clock_offset_ns > $from_ns AND h.start_ns - n.clock_offset_ns < $to_ns
),
slices AS (
    SELECT * FROM collective UNION ALL BY NAME SELECT * FROM wait
    UNION ALL BY NAME SELECT * FROM prewindow UNION ALL BY NAME SELECT * FROM activity
)
SELECT cluster_id, node_id, rank, pid, tid, kind,
       greatest(start_ns, $from_ns) AS start_ns, least(end_ns, $to_ns) AS end_ns,
       causal_chain_id, step, round(late_ms, 3) AS late_ms, round(gpu_late_ms, 3) AS gpu_late_ms, late, state,
       cuda_call
FROM slices
WHERE end_ns >= start_ns AND end_ns > $from_ns AND start_ns < $to_ns
ORDER BY start_ns, node_id, rank, kind
LIMIT $max_rows;

-- name: lateness_heatmap
-- Ranks x steps of the primary communicator's first collective of each step in the window: how late
-- each rank arrived (ms, host or GPU side, whichever is larger; negative = early against the instance's
-- reference) and whether the analysis called it late. The latest $max_steps steps.
WITH l AS (
    SELECT cluster_id, node_id, rank, step, greatest(host_late_ns, coalesce(gpu_late_ns, 0)) / 1e6 AS late_ms,
           (host_late OR gpu_late_ns IS NOT NULL) AS late, threshold_ns
    FROM rk_lateness($start_ns, $end_ns, $cluster_id, job := $job_id)
    WHERE on_primary AND pos = 0 AND step IS NOT NULL
),
kept AS (
    SELECT cluster_id, step FROM (SELECT DISTINCT cluster_id, step FROM l)
    QUALIFY row_number() OVER (PARTITION BY cluster_id ORDER BY step DESC) <= $max_steps
)
SELECT l.cluster_id, l.node_id, l.rank, l.step, round(l.late_ms, 3) AS late_ms, l.late,
       round(l.threshold_ns / 1e6, 3) AS threshold_ms
FROM l SEMI JOIN kept k ON k.cluster_id = l.cluster_id AND k.step = l.step
ORDER BY l.cluster_id, l.rank, l.step
LIMIT $max_rows;
