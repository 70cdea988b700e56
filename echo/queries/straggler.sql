-- The straggler analysis, as example queries served to agents in the schema resource
-- (rankecho://schema). Each reads one layer of the analysis (echo/queries/layers), called like a table
-- with (start_ns, end_ns, cluster_id); NULL means open or any. fleet.cluster.find_stragglers answers
-- the whole question in one call; these show the layers beneath it.

-- name: example_late_ranks
-- Who held the others back: every straggler (a rank, or a node whose ranks were late together) with
-- its late episodes, median lateness, period in steps, cause and the GPU-seconds the others waited.
SELECT kind, node_id, rank, episodes, round(median_late_ms, 1) AS median_late_ms, period,
       round(period_confidence, 2) AS period_confidence, cause, side, round(imposed_gpu_s, 3) AS imposed_gpu_s
FROM rk_stragglers(NULL, NULL, NULL)
WHERE significant
ORDER BY imposed_gpu_s DESC;

-- name: example_late_collectives
-- The collective instances someone was late to: arrival spread, the last rank on the host and GPU
-- side, the delay the on-time ranks waited beyond normal, and the GPU-seconds it cost.
SELECT causal_chain_id, step, ranks, round(spread_ms, 1) AS spread_ms, last_host_node, last_host_rank,
       round(last_host_late_ms, 1) AS last_host_late_ms, last_gpu_rank, round(delay_ms, 1) AS delay_ms,
       round(imposed_gpu_s, 3) AS imposed_gpu_s
FROM rk_instances(NULL, NULL, NULL)
WHERE late_ranks > 0
ORDER BY imposed_gpu_s DESC
LIMIT 20;

-- name: example_before_late_entry
-- What each late rank's calling thread did before it entered late (ns per cause class, against the
-- median of its on-time peers at the same collective).
SELECT node_id, rank, step, round(late_by_ns / 1e6, 1) AS late_ms, cause, spent_ns, peers_ns
FROM rk_episodes(NULL, NULL, NULL)
WHERE step IS NOT NULL
ORDER BY late_by_ns DESC
LIMIT 20;

-- name: example_clock_offsets
-- Each node's clock offset as estimated from the collectives' common completions (subtracted from its
-- timestamps), with its uncertainty.
SELECT cluster_id, node_id, offset_ns / 1e6 AS offset_ms, uncertainty_ns / 1e6 AS uncertainty_ms, instances,
       reference_node
FROM rk_clock_offsets(NULL, NULL, NULL)
ORDER BY cluster_id, node_id;
