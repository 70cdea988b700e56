-- The fan-in proof's four queries, verbatim: they must run unchanged in the duckdb CLI.

-- name: per_node_events
-- Events per (cluster, node): every producer node must show exactly its events_per_producer.
SELECT cluster_id, node_id, COUNT(*) AS events
FROM events
GROUP BY cluster_id, node_id
ORDER BY node_id;

-- name: chains
-- Distinct causal-chain markers that came back from the store: none lost, none merged.
SELECT COUNT(DISTINCT json_extract_string(attrs_json, '$.causal_chain_id')) AS chains
FROM events
WHERE attrs_json LIKE '%causal_chain_id%';

-- name: stragglers
-- Rows under the straggler threshold per node: exactly the planted ones.
SELECT node_id, COUNT(*) AS straggler_events
FROM events
WHERE value_double < 0.40
GROUP BY node_id;

-- name: health_quantiles
-- Median and p95 health by node: stragglers are rare, so healthy nodes keep a high median.
SELECT node_id,
       quantile_cont(value_double, 0.5)  AS median_health,
       quantile_cont(value_double, 0.95) AS p95_health
FROM events
GROUP BY node_id;

-- name: total
-- All events land.
SELECT COUNT(*) FROM events;

-- name: duplicates
-- Event ids stored more than once (must be 0: resends are idempotent).
SELECT COUNT(*) - COUNT(DISTINCT event_id) AS duplicates FROM events;
