-- Named queries behind fleet.cluster.find_hangs and the failures section of `rankecho diagnose`: thin
-- calls of echo/queries/layers/60_failures.sql. $start_ns / $end_ns NULL = open window, $cluster_id NULL
-- = every cluster, $job_id NULL = every job (each row names its job).

-- name: find_open_hangs
-- Open instances older than their hang threshold at $now_ns whose missing ranks are still alive, oldest
-- first; $min_open_ns NULL = the threshold from rk_failure_tuning and the job's step time.
SELECT * FROM rk_hangs($start_ns, $end_ns, $cluster_id, $now_ns, min_open_ns := $min_open_ns, job := $job_id)
ORDER BY first_enter_ns, cluster_id, job_id, causal_chain_id
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
