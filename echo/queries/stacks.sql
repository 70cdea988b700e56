-- Named queries behind the stack views (fleet.cluster.stacks, the stacks of explain_straggler and
-- find_stragglers, `rankecho stacks`): thin calls of echo/queries/layers/70_stacks.sql. Times are the
-- node's own clock; $start_ns / $end_ns NULL = open, $cluster_id / $node_id NULL = any, $job_id NULL =
-- every job.

-- name: rank_stacks
-- One rank's stacks over the window by the time they carried, most first, with each one's folded form
-- (root first, ';'-joined; '[stack <id>]' when the stack point was not stored).
SELECT *, coalesce(rk_folded_frames(frames), '[stack ' || stack_id || ']') AS folded
FROM rk_top_stacks((SELECT ws FROM rk_rank_windows($start_ns, $end_ns, $cluster_id, $node_id, $rank,
                                                   job := $job_id)))
LIMIT $max_rows;

-- name: call_stacks
-- The stacks of ranks $ranks on $node_id in the pre-call windows of their collectives $chains (the late
-- episodes find_stragglers lists), by the time they carried, most first; the calls are looked for in
-- [$start_ns, $end_ns) (NULL = open).
SELECT *, coalesce(rk_folded_frames(frames), '[stack ' || stack_id || ']') AS folded
FROM rk_top_stacks((SELECT ws FROM rk_call_windows($cluster_id, $node_id, $ranks, $chains, job := $job_id,
                                                   lo := $start_ns, hi := $end_ns)))
LIMIT $max_rows;

-- name: stack_diff
-- The late rank's stacks against its peers' ($windows: {w, role 'target' | 'peer', cluster_id, node_id,
-- pid, tid, from_ns, to_ns}), largest excess first (rk_stack_diff).
SELECT * FROM rk_stack_diff($windows) LIMIT $max_rows;
