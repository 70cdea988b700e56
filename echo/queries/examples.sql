-- Example investigation queries, served to agents in the schema resource (rankecho://schema) so they
-- write correct SQL on the first try, after the fan-in proof's four queries (echo/queries/fanin/fanin.sql).

-- name: example_slowest_rank_per_collective
-- Per collective instance (causal_chain_id), the rank that entered last and how far behind the first.
SELECT causal_chain_id,
       arg_max(rank, timestamp_ns) AS last_rank,
       (max(timestamp_ns) - min(timestamp_ns)) / 1e6 AS spread_ms,
       count(*) AS ranks_seen
FROM events
WHERE metric_name = 'rankecho.nccl.collective' AND causal_chain_id IS NOT NULL
GROUP BY causal_chain_id
ORDER BY spread_ms DESC
LIMIT 20;

-- name: example_per_minute_health
-- Per-minute mean health by node over the newest hour of data.
SELECT node_id,
       to_timestamp(timestamp_ns // 60000000000 * 60) AS minute,
       avg(value_double) AS mean_health
FROM events
WHERE metric_name = 'rankecho.health.score'
  AND timestamp_ns >= (SELECT max(timestamp_ns) FROM events) - 3600000000000
GROUP BY ALL
ORDER BY minute, node_id;

-- name: example_attribute_lookup
-- Reading an attribute whose key contains dots: quote the key inside the JSON path.
SELECT node_id, json_extract_string(attrs_json, '$."rankecho.gpu.model"') AS gpu_model, count(*) AS events
FROM events
GROUP BY ALL
ORDER BY events DESC;

-- name: example_late_rank_stacks
-- Call stacks (docs/stacks.md): which stacks carried each rank's CUDA-call and off-CPU time, callee first;
-- LEFT JOIN, since a stack may be cited before its frames are stored.
SELECT h.node_id, h.rank, h.category, rk_lead_frames(s.frames, 4) AS leading_frames,
       sum(h.end_ns - h.start_ns) / 1e6 AS ms, count(*) AS intervals
FROM host_activity h LEFT JOIN stacks s USING (stack_id)
WHERE h.stack_id IS NOT NULL
GROUP BY ALL
ORDER BY ms DESC
LIMIT 20;
