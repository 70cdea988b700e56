-- Named queries behind the diagnosis tools (find_stragglers, explain_straggler, the clock section of
-- summary, the stall costs of get_cost) and `rankecho diagnose`. Each is a thin call of the analysis
-- layers (echo/queries/layers/); $start_ns / $end_ns NULL = open window, $cluster_id NULL = every
-- cluster, $min_late_ms NULL = the threshold comes from the job's own noise alone, $job_id (optional)
-- NULL = every job, '' = points without a job id.

-- name: find_stragglers
-- The stragglers of every cluster in the window (rk_stragglers), significant ones first, by imposed
-- wait, each with its latest $max_episodes episodes (oldest first; the column episodes counts them
-- all); a cluster without any appears once with kind NULL and its noise level.
SELECT * REPLACE (list_slice(episode_list, -$max_episodes, -1) AS episode_list)
FROM rk_stragglers($start_ns, $end_ns, $cluster_id, min_late_ms := $min_late_ms, job := $job_id)
LIMIT $max_rows;

-- name: clock_offsets
-- Per (cluster, node): the clock offset estimated from the collectives' common completions, with its
-- uncertainty, the instances it rests on and the reference node (offset 0).
SELECT cluster_id, node_id, ranks, offset_ns / 1e6 AS offset_ms, uncertainty_ns / 1e6 AS uncertainty_ms,
       instances, reference_node
FROM rk_clock_offsets($start_ns, $end_ns, NULL, job := $job_id)
ORDER BY cluster_id, node_id
LIMIT $max_rows;

-- name: stream_alignment
-- Per (cluster, how streams were placed on the common numbering): streams and calls. Anything but
-- 'aligned' means an agent attached mid-run or restarted; 'unmatched' and 'held_back' streams are left out.
SELECT cluster_id, alignment, count(*) AS streams, sum(calls) AS calls,
       list(DISTINCT node_id ORDER BY node_id) AS nodes, max(fit_ns) / 1e6 AS worst_fit_ms
FROM rk_stream_alignment($start_ns, $end_ns, NULL, job := $job_id)
GROUP BY ALL
ORDER BY cluster_id, alignment
LIMIT $max_rows;

-- name: held_back_streams
-- The streams of agents that attached mid-run or restarted that the alignment held back (too few steps,
-- or another shift fits about as well: the align_* parameters of rk_params): left out of every cross-rank comparison
-- until more data arrives. Per stream: where, the steps observed and why.
SELECT cluster_id, node_id, rank, comm_id, stream_steps AS steps, held_reason AS reason
FROM rk_stream_placement($start_ns, $end_ns, $cluster_id, job := $job_id)
WHERE method = 'held_back'
ORDER BY cluster_id, node_id, rank, comm_id
LIMIT $max_rows;

-- name: locate_call
-- The node-clock time of ($node_id, $rank)'s collective with causal_chain_id $chain as the agent
-- sent it (a realigned id is resolved by explain_arrival).
SELECT cluster_id, enter_ns, job_id
FROM collectives
WHERE node_id = $node_id AND rank = $rank AND causal_chain_id = $chain
  AND ($job_id IS NULL OR job_id = $job_id)
ORDER BY enter_ns
LIMIT 1;

-- name: explain_arrival
-- The collective instance ($node_id, $rank) called nearest $at_ns (its node's clock), or the one whose
-- realigned id is $chain: every rank's arrival at it on the reference clock, with lateness, the GPU
-- rule's verdict and which row is the rank asked about (is_target); with each rank's pre-call window as
-- its agent summarised it (window_ms and ms per class; NULL when the agent sent raw intervals instead).
WITH l AS MATERIALIZED (SELECT * FROM rk_lateness($start_ns, $end_ns, $cluster_id, job := $job_id)),
target AS (
    SELECT cluster_id, comm_key, seq_g
    FROM l
    WHERE node_id = $node_id AND rank = $rank
    ORDER BY (comm_key || ':' || seq_g) IS DISTINCT FROM $chain,
             abs(enter_c + clock_offset_ns - coalesce($at_ns, enter_c + clock_offset_ns))
    LIMIT 1
)
SELECT l.cluster_id, l.node_id, l.rank, l.pid, l.tid, l.comm_key || ':' || l.seq_g AS causal_chain_id,
       l.step, l.n, l.enter_c, l.clock_offset_ns,
       l.host_late_ns / 1e6 AS host_late_ms, l.gpu_late_ns / 1e6 AS gpu_late_ms, l.delay_ns / 1e6 AS delay_ms,
       l.threshold_ns / 1e6 AS threshold_ms, l.presync_ns / 1e6 AS presync_ms,
       (l.node_id = $node_id AND l.rank = $rank) AS is_target,
       p.pre_window_ns / 1e6 AS window_ms, p.pre_allocator_ns / 1e6 AS allocator_ms,
       p.pre_slow_gpu_ns / 1e6 AS slow_gpu_ms, p.pre_memcpy_ns / 1e6 AS memcpy_ms,
       p.pre_cpu_contention_ns / 1e6 AS cpu_contention_ms, p.pre_sleeping_ns / 1e6 AS sleeping_ms,
       greatest(p.pre_window_ns - p.pre_allocator_ns - p.pre_slow_gpu_ns - p.pre_memcpy_ns
                - p.pre_cpu_contention_ns - p.pre_sleeping_ns, 0) / 1e6 AS host_compute_ms
FROM l JOIN target t USING (cluster_id, comm_key, seq_g)
LEFT JOIN rk_pre_calls() p ON p.stream = l.stream AND p.seq = l.seq
 AND p.enter_ns BETWEEN coalesce($start_ns, 0) - 5000000000 AND coalesce($end_ns, 9e18::BIGINT) + 5000000000
ORDER BY l.enter_c;

-- name: explain_timeline
-- What one thread of $cluster_id did in [$from_ns, $to_ns) (its node's clock): each interval with its
-- category, start relative to $to_ns (ms, negative = before) and length, clipped to the window
-- (intervals that began more than a minute before the window are not looked for).
SELECT kind, cuda_call, state, category,
       (greatest(start_ns, $from_ns) - $to_ns) / 1e6 AS start_ms,
       (least(end_ns, $to_ns) - greatest(start_ns, $from_ns)) / 1e6 AS ms
FROM host_activity
WHERE thread_key = hash($cluster_id, $node_id, $pid, $tid)
  AND start_bucket BETWEEN $from_ns // 1000000000 - 60 AND $to_ns // 1000000000
  AND end_ns > $from_ns AND start_ns < $to_ns
ORDER BY start_ns
LIMIT $max_rows;

-- name: explain_breakdown
-- For each window in $windows (a list of {cluster_id, node_id, pid, tid, from_ns, to_ns}, node clocks):
-- the time its thread spent in each category (ms); host_compute_ms is what no interval covers.
WITH w AS (SELECT unnest($windows, recursive := true)),
spent AS (
    SELECT w.node_id, w.pid, w.tid, w.from_ns, w.to_ns,
           h.category,
           least(h.end_ns, w.to_ns) - greatest(h.start_ns, w.from_ns) AS ns
    FROM w JOIN host_activity h
      ON h.thread_key = hash(w.cluster_id, w.node_id, w.pid, w.tid)
     AND h.start_bucket BETWEEN w.from_ns // 1000000000 - 60 AND w.to_ns // 1000000000
     AND h.end_ns > w.from_ns AND h.start_ns < w.to_ns
)
SELECT w.node_id, w.pid, w.tid, (w.to_ns - w.from_ns) / 1e6 AS window_ms,
       coalesce(sum(s.ns) FILTER (WHERE s.category = 'allocator'), 0) / 1e6 AS allocator_ms,
       coalesce(sum(s.ns) FILTER (WHERE s.category = 'slow_gpu'), 0) / 1e6 AS slow_gpu_ms,
       coalesce(sum(s.ns) FILTER (WHERE s.category = 'memcpy'), 0) / 1e6 AS memcpy_ms,
       coalesce(sum(s.ns) FILTER (WHERE s.category = 'cpu_contention'), 0) / 1e6 AS cpu_contention_ms,
       coalesce(sum(s.ns) FILTER (WHERE s.category = 'sleeping'), 0) / 1e6 AS sleeping_ms,
       greatest(w.to_ns - w.from_ns - coalesce(sum(s.ns) FILTER (WHERE s.category IS NOT NULL), 0), 0) / 1e6
           AS host_compute_ms
FROM w LEFT JOIN spent s USING (node_id, pid, tid, from_ns, to_ns)
GROUP BY w.node_id, w.pid, w.tid, w.from_ns, w.to_ns
LIMIT $max_rows;

-- name: explain_excess
-- A late rank's excess per cause class over its peers' median, and the dominant class, by the rule
-- find_stragglers uses (rk_cause_excess, rk_top_cause). $mine and $peers: structs of ms per class
-- ($peers NULL when no on-time peer was found).
SELECT rk_cause_excess($mine, $peers) AS excess, rk_top_cause(rk_cause_excess($mine, $peers)) AS top;

-- name: find_links
-- The slow links of every cluster in the window (rk_links: kind 'link', named by node, node pair or rank;
-- node_id NULL when the data singles out none), significant ones first, each with its latest $max_episodes
-- slow steps.
SELECT * REPLACE (list_slice(episode_list, -$max_episodes, -1) AS episode_list)
FROM rk_links($start_ns, $end_ns, $cluster_id, min_late_ms := $min_late_ms, job := $job_id)
LIMIT $max_rows;
