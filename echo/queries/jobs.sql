-- Jobs: which job each collective belongs to is collectives.job_id (the agent's rankecho.job.id; '' for
-- points without one). The tools analyse one job at a time: the one asked for, else the most recent
-- one in the window. $start_ns / $end_ns NULL = open window (node clocks), $cluster_id NULL = every
-- cluster.

-- name: latest_job
-- The job of the window's newest collective call: what a tool analyses when no job_id is given. No row
-- when the window holds no collective.
SELECT job_id, cluster_id
FROM collectives
WHERE ($start_ns IS NULL OR enter_ns >= $start_ns)
  AND ($end_ns IS NULL OR enter_ns < $end_ns)
  AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
ORDER BY enter_ns DESC, job_id
LIMIT 1;

-- name: jobs_in_window
-- One row per (cluster, job) with collective calls in the window, newest first: its ranks and nodes,
-- first and last call (node clocks), calls; the steps and stragglers come from the analysis per job.
SELECT cluster_id, job_id,
       count(DISTINCT rank) AS ranks,
       max(nranks) AS world_size,
       list(DISTINCT node_id ORDER BY node_id) AS nodes,
       min(enter_ns) AS first_ns,
       max(enter_ns) AS last_ns,
       count(*) AS calls
FROM collectives
WHERE ($start_ns IS NULL OR enter_ns >= $start_ns)
  AND ($end_ns IS NULL OR enter_ns < $end_ns)
  AND ($cluster_id IS NULL OR cluster_id = $cluster_id)
GROUP BY cluster_id, job_id
ORDER BY last_ns DESC, cluster_id, job_id
LIMIT $max_rows;

-- name: job_at_call
-- The job of ($node_id, $rank)'s collective call with causal_chain_id $chain, else of its call nearest
-- $at_ns (within 15 s): what explain_straggler analyses when no job_id is given.
SELECT job_id
FROM collectives
WHERE node_id = $node_id AND rank = $rank
  AND (causal_chain_id = $chain OR ($at_ns IS NOT NULL AND enter_ns BETWEEN $at_ns - 15000000000 AND $at_ns + 15000000000))
ORDER BY causal_chain_id IS DISTINCT FROM $chain, abs(enter_ns - coalesce($at_ns, enter_ns))
LIMIT 1;
