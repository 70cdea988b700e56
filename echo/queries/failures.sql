-- Named queries behind fleet.cluster.find_hangs and the failures section of `rankecho diagnose`: thin
-- calls of echo/queries/layers/60_failures.sql. $start_ns / $end_ns NULL = open window, $cluster_id NULL
-- = every cluster, $job_id NULL = every job (each row names its job).

-- name: find_open_hangs
-- Open instances older than their hang threshold at $now_ns whose missing ranks are still alive, oldest
-- first; $min_open_ns NULL = the threshold from hang_min_ns / hang_steps (rk_params) and the job's step
-- time. doing: what each missing rank reported doing at its latest heartbeat since the instance opened (rk_rank_states).
WITH h AS (
    SELECT * FROM rk_hangs($start_ns, $end_ns, $cluster_id, $now_ns, min_open_ns := $min_open_ns, job := $job_id)
),
d AS (
    SELECT h.cluster_id, h.job_id, h.causal_chain_id,
           list({'rank': s.rank, 'node_id': s.node_id, 'at_ns': s.at_ns, 'quiet_s': s.quiet_s, 'call': s.call,
                 'call_s': s.call_s,
                 'off_cpu_s': s.off_cpu_s, 'sleeping': s.sleeping, 'stack_id': s.stack_id, 'recent_s': s.recent_s,
                 'recent_by_class_s': s.recent_by_class_s,
                 'leading_frames': s.leading_frames} ORDER BY s.rank) AS doing
    FROM h JOIN rk_rank_states($start_ns, $end_ns, $cluster_id, job := $job_id) s
      ON s.cluster_id = h.cluster_id AND s.job_id = h.job_id AND list_contains(h.missing, s.rank)
     AND s.at_ns >= h.first_enter_ns
    GROUP BY ALL
)
SELECT h.*, coalesce(d.doing, []) AS doing
FROM h LEFT JOIN d USING (cluster_id, job_id, causal_chain_id)
ORDER BY h.first_enter_ns, h.cluster_id, h.job_id, h.causal_chain_id
LIMIT $max_rows;

-- name: find_crashes
-- Rank exits while the job still needed the rank, earliest first (first = the crash of its job).
SELECT * FROM rk_crashes($start_ns, $end_ns, $cluster_id, job := $job_id)
ORDER BY exit_ns, cluster_id, job_id, rank
LIMIT $max_rows;

-- name: find_desyncs
-- Instances whose ranks issued different collectives (op or byte count), earliest first.
SELECT * FROM rk_desyncs($start_ns, $end_ns, $cluster_id, job := $job_id)
ORDER BY first_enter_ns, cluster_id, job_id, causal_chain_id
LIMIT $max_rows;
