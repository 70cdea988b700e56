-- Layer 4: late episodes (a rank late at a step) and why it was late.
-- Cause: what the rank's calling thread did between the end of its previous step (its previous
-- completion) and its late call, against the median of its on-time peers at the same instance over
-- their own such windows: time in cudaMalloc/cudaFree (allocator), blocked in its own syncs waiting
-- for its GPU (slow_gpu), in blocking copies (memcpy), off-CPU while runnable (cpu_contention),
-- off-CPU sleeping outside CUDA calls (sleeping: data loader, I/O, locks), and the rest of the
-- window on the CPU (host_compute). The cause is the category with the largest excess (rk_cause_excess).

-- name: rk_expected_contention
-- The preemption a rank's on-CPU time would meet at its peers' ratio of preempted to on-CPU time (at
-- least the peers' own preemption).
CREATE OR REPLACE TEMP MACRO rk_expected_contention(m, p) AS (
    greatest(coalesce(p['cpu_contention'], 0),
             coalesce(p['cpu_contention'] / nullif(p['host_compute'], 0), 0) * m['host_compute'])
);

-- name: rk_cause_excess
-- The excess of a late rank's pre-call time per cause class (m: a struct of time per class) over its
-- peers' median (p, the same struct; NULL = no peers), in m's unit. On a busy machine every runnable
-- thread loses a share of its CPU time to other work, so a rank that computed longer is also
-- preempted longer without any contention of its own: contention counts only beyond what the peers'
-- ratio of preempted to on-CPU time predicts for the rank's own on-CPU time, and the time up to that
-- counts as host compute. A noisy neighbour on the rank's own core still shows: the rank computed no
-- longer than its peers, yet was kept off the CPU far longer.
CREATE OR REPLACE TEMP MACRO rk_cause_excess(m, p) AS (
    {'allocator': m['allocator'] - coalesce(p['allocator'], 0),
     'slow_gpu': m['slow_gpu'] - coalesce(p['slow_gpu'], 0),
     'memcpy': m['memcpy'] - coalesce(p['memcpy'], 0),
     'cpu_contention': m['cpu_contention'] - rk_expected_contention(m, p),
     'sleeping': m['sleeping'] - coalesce(p['sleeping'], 0),
     'host_compute': m['host_compute'] + least(m['cpu_contention'], rk_expected_contention(m, p))
                     - coalesce(p['host_compute'], 0) - coalesce(p['cpu_contention'], 0)}
);

-- name: rk_top_cause
-- The cause class with the largest excess in x (a struct from rk_cause_excess); ties go to the first
-- in this order.
CREATE OR REPLACE TEMP MACRO rk_top_cause(x) AS (
    CASE greatest(x['allocator'], x['slow_gpu'], x['memcpy'], x['cpu_contention'], x['sleeping'],
                  x['host_compute'])
        WHEN x['allocator'] THEN 'allocator' WHEN x['slow_gpu'] THEN 'slow_gpu' WHEN x['memcpy'] THEN 'memcpy'
        WHEN x['cpu_contention'] THEN 'cpu_contention' WHEN x['sleeping'] THEN 'sleeping'
        ELSE 'host_compute' END
);

-- name: rk_episodes
-- One row per late episode (cluster, node, rank, step): late_by_ns (the worst lateness over the
-- step's instances, host or GPU), side ('gpu' when the cause is the rank's own GPU), the instance
-- that opened it (causal_chain_id, timestamp_ns = the rank's call on the reference clock), cause
-- and the category breakdown of the rank and of its peers' median (ns), imposed_gpu_ns (the delay of
-- the step's instances it was the last arrival of, times the ranks that waited) and node_size (ranks
-- of its node in the cluster). Every row also carries its cluster's context (noise, threshold_ns,
-- steps, step_ns, first/last step completion, the reference node whose clock the times are on); a
-- cluster without any late episode appears once,
-- with NULL episode columns, so "no straggler" still comes with the noise it was measured against.
CREATE OR REPLACE TEMP MACRO rk_episodes(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
WITH l AS MATERIALIZED (SELECT * FROM rk_lateness(start_ns, end_ns, cluster, min_late_ms, job := job)),
late_rows AS MATERIALIZED (SELECT * FROM l WHERE host_late OR gpu_late_ns IS NOT NULL),
per_inst AS (  -- per instance with someone late: how many ranks were, and who was the latest (the culprit)
    SELECT inst_key, count(*) AS late_ranks, arg_max(rank, greatest(host_late_ns, coalesce(gpu_late_ns, 0))) AS culprit
    FROM late_rows GROUP BY inst_key
),
flagged AS (
    SELECT l.*, greatest(l.host_late_ns, coalesce(l.gpu_late_ns, 0)) AS late_ns, p.late_ranks,
           l.rank = p.culprit AS culprit
    FROM late_rows l JOIN per_inst p USING (inst_key)
),
steps AS (
    SELECT cluster_id, node_id, rank, step,
           arg_min(comm_key || ':' || seq_g, enter_c) AS causal_chain_id,
           CAST(min(enter_c) AS BIGINT) AS timestamp_ns,
           max(late_ns) AS late_by_ns,
           bool_or(gpu_late_ns IS NOT NULL) AS gpu_named,
           any_value(threshold_ns) AS threshold_ns,
           coalesce(max(greatest(delay_ns, 0) * (n - late_ranks)) FILTER (WHERE culprit), 0) AS imposed_gpu_ns,
           max(delay_ns) AS delay_ns
    FROM flagged
    GROUP BY ALL
),
late AS MATERIALIZED (  -- per (rank, step): the first late instance opens the episode; the causes of a
    -- rank's latest cause_max_episodes (256) episodes are looked into (the rest keep a NULL cause)
    SELECT * FROM (
        SELECT DISTINCT ON (cluster_id, node_id, rank, step) cluster_id, node_id, rank, step, inst_key
        FROM late_rows
        ORDER BY cluster_id, node_id, rank, step, enter_c
    )
    QUALIFY row_number() OVER (PARTITION BY cluster_id, node_id, rank ORDER BY step DESC)
            <= rk_param('cause_max_episodes')
),
members AS (  -- the late rank and up to cause_peers (8) of its on-time peers at that instance
    SELECT e.node_id AS late_node, e.rank AS late_rank, r.*,
           r.rank = e.rank AND r.node_id = e.node_id AS is_late
    FROM l r
    JOIN late e USING (inst_key)
    WHERE (r.rank = e.rank AND r.node_id = e.node_id) OR (NOT r.host_late AND r.gpu_late_ns IS NULL)
    QUALIFY row_number() OVER (PARTITION BY inst_key, e.node_id, e.rank
                               ORDER BY (r.rank = e.rank AND r.node_id = e.node_id) DESC, r.rank)
            <= 1 + rk_param('cause_peers')
),
windows AS MATERIALIZED (  -- from the end of each member's previous step (its stream's previous call;
    -- the few members on the right, the side a hash join builds), with the agent's summary of it if sent
    SELECT m.cluster_id, m.late_node, m.late_rank, m.step, m.node_id, m.rank, m.thread_key, m.is_late,
           coalesce(CASE WHEN p.complete_c IS DISTINCT FROM m.complete_c THEN p.complete_c ELSE p.return_c END,
                    m.enter_c - rk_param('default_window_ns')) AS w_start,
           m.enter_c AS w_end, m.clock_offset_ns, q.* EXCLUDE (stream, seq, enter_ns)
    FROM l p RIGHT JOIN members m ON p.stream = m.stream AND p.seq = m.seq - 1
    LEFT JOIN (SELECT * FROM rk_pre_calls()
               WHERE enter_ns BETWEEN (SELECT min(enter_c + clock_offset_ns) FROM members)
                                  AND (SELECT max(enter_c + clock_offset_ns) FROM members)) q
      ON q.stream = m.stream AND q.seq = m.seq
),
window_buckets AS MATERIALIZED (  -- each window once per 1 s bucket an overlapping interval can start in
    -- (raw clock): its own and the one before (an interval that began earlier is not looked for: the
    -- bound keeps the bucket join small, whatever the longest interval in the store)
    SELECT w.*, unnest(range((w.w_start + w.clock_offset_ns) // 1000000000 - 1,
                             (w.w_end + w.clock_offset_ns) // 1000000000 + 1)) AS bucket
    FROM windows w
    WHERE w.pre_window_ns IS NULL  -- summarised by its agent: nothing to look up
),
spent AS (
    SELECT w.cluster_id, w.late_node, w.late_rank, w.step, w.node_id, w.rank, w.is_late, h.category,
           least(h.end_ns - w.clock_offset_ns, w.w_end) - greatest(h.start_ns - w.clock_offset_ns, w.w_start) AS ns
    FROM window_buckets w
    JOIN host_activity h ON h.thread_key = w.thread_key AND h.start_bucket = w.bucket
     AND h.end_ns - w.clock_offset_ns > w.w_start AND h.start_ns - w.clock_offset_ns < w.w_end
    -- a constant bound the scan can skip row groups with: the windows are the latest episodes'
    WHERE h.start_bucket BETWEEN (SELECT min(bucket) FROM window_buckets) AND (SELECT max(bucket) FROM window_buckets)
),
from_intervals AS (  -- the windows no agent summarised, from the raw intervals
    SELECT cluster_id, late_node, late_rank, step, node_id, rank,
           sum(ns) FILTER (WHERE category = 'allocator') AS allocator_ns,
           sum(ns) FILTER (WHERE category = 'slow_gpu') AS slow_gpu_ns,
           sum(ns) FILTER (WHERE category = 'memcpy') AS memcpy_ns,
           sum(ns) FILTER (WHERE category = 'cpu_contention') AS cpu_contention_ns,
           sum(ns) FILTER (WHERE category = 'sleeping') AS sleeping_ns
    FROM spent GROUP BY ALL
),
w AS MATERIALIZED (
    SELECT *, greatest(window_ns - allocator_ns - slow_gpu_ns - memcpy_ns - cpu_contention_ns - sleeping_ns, 0)
                  AS host_compute_ns
    FROM (
        SELECT w.cluster_id, w.late_node, w.late_rank, w.step, w.node_id, w.rank, w.is_late,
               coalesce(w.pre_window_ns, w.w_end - w.w_start) AS window_ns,
               coalesce(w.pre_allocator_ns, s.allocator_ns, 0) AS allocator_ns,
               coalesce(w.pre_slow_gpu_ns, s.slow_gpu_ns, 0) AS slow_gpu_ns,
               coalesce(w.pre_memcpy_ns, s.memcpy_ns, 0) AS memcpy_ns,
               coalesce(w.pre_cpu_contention_ns, s.cpu_contention_ns, 0) AS cpu_contention_ns,
               coalesce(w.pre_sleeping_ns, s.sleeping_ns, 0) AS sleeping_ns
        FROM windows w
        LEFT JOIN from_intervals s USING (cluster_id, late_node, late_rank, step, node_id, rank)
    )
),
mine AS (SELECT * FROM w WHERE is_late),
peers AS (
    SELECT cluster_id, late_node, late_rank, step, count(*) AS peers,
           median(allocator_ns) AS allocator_ns, median(slow_gpu_ns) AS slow_gpu_ns, median(memcpy_ns) AS memcpy_ns,
           median(cpu_contention_ns) AS cpu_contention_ns, median(sleeping_ns) AS sleeping_ns,
           median(host_compute_ns) AS host_compute_ns
    FROM w WHERE NOT is_late GROUP BY ALL
),
evidence AS (  -- the late rank's window and its peers' median, as structs of ns per class
    SELECT m.cluster_id, m.late_node AS node_id, m.late_rank AS rank, m.step,
           {'allocator': m.allocator_ns, 'slow_gpu': m.slow_gpu_ns, 'memcpy': m.memcpy_ns,
            'cpu_contention': m.cpu_contention_ns, 'sleeping': m.sleeping_ns,
            'host_compute': m.host_compute_ns} AS spent_ns,
           CASE WHEN p.peers IS NOT NULL THEN
           {'allocator': p.allocator_ns, 'slow_gpu': p.slow_gpu_ns, 'memcpy': p.memcpy_ns,
            'cpu_contention': p.cpu_contention_ns, 'sleeping': p.sleeping_ns,
            'host_compute': p.host_compute_ns} END AS peers_ns
    FROM mine m LEFT JOIN peers p USING (cluster_id, late_node, late_rank, step)
),
top AS (
    SELECT *, rk_top_cause(rk_cause_excess(spent_ns, peers_ns)) AS top_category FROM evidence
),
context AS (
    SELECT cluster_id, any_value(noise_median_ns) AS noise_median_ns, any_value(noise_sigma_ns) AS noise_sigma_ns,
           any_value(threshold_ns) AS cluster_threshold_ns, any_value(step_ns) AS step_ns,
           any_value(steps) AS steps, any_value(first_done_c) AS first_done_c, any_value(last_done_c) AS last_done_c,
           count(DISTINCT rank) AS cluster_ranks, any_value(reference_node) AS reference_node
    FROM l GROUP BY cluster_id
),
node_sizes AS (SELECT cluster_id, node_id, count(DISTINCT rank) AS node_size FROM l GROUP BY ALL),
episodes AS (
    SELECT s.*,
           CASE WHEN s.gpu_named THEN 'slow_gpu' ELSE t.top_category END AS cause,
           CASE WHEN s.gpu_named OR t.top_category = 'slow_gpu' THEN 'gpu' ELSE 'host' END AS side,
           t.spent_ns, t.peers_ns, n.node_size
    FROM steps s
    LEFT JOIN top t USING (cluster_id, node_id, rank, step)
    JOIN node_sizes n USING (cluster_id, node_id)
)
SELECT c.*, e.* EXCLUDE (cluster_id)
FROM context c LEFT JOIN episodes e USING (cluster_id);
