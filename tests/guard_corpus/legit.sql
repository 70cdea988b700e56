# Legitimate analytical queries: the guard must allow every one, and the guarded result must equal the
# unguarded one. Entries are separated by lines of '===='. The first four are the fan-in proof's.
====
SELECT cluster_id, node_id, COUNT(*) AS events
FROM events
GROUP BY cluster_id, node_id
ORDER BY node_id;
====
SELECT COUNT(DISTINCT json_extract_string(attrs_json, '$.causal_chain_id')) AS chains
FROM events
WHERE attrs_json LIKE '%causal_chain_id%';
====
SELECT node_id, COUNT(*) AS straggler_events
FROM events
WHERE value_double < 0.40
GROUP BY node_id;
====
SELECT node_id,
       quantile_cont(value_double, 0.5)  AS median_health,
       quantile_cont(value_double, 0.95) AS p95_health
FROM events
GROUP BY node_id;
====
SELECT count(*) FROM events
====
select count(*) from events
====
FROM events SELECT count(*)
====
SELECT * FROM events ORDER BY event_id LIMIT 5
====
SELECT * EXCLUDE (attrs_json) FROM events ORDER BY timestamp_ns, event_id LIMIT 10
====
SELECT node_id, rank, count(*) AS n FROM events GROUP BY ALL ORDER BY ALL
====
SELECT metric_name, signal, count(*) FROM events GROUP BY 1, 2 ORDER BY 3 DESC, 1
====
SELECT min(timestamp_ns), max(timestamp_ns), max(timestamp_ns) - min(timestamp_ns) AS span_ns FROM events
====
SELECT node_id, median(value_double) AS med, avg(value_double) AS mean, stddev_samp(value_double) AS sd
FROM events WHERE metric_name = 'rankecho.health.score' GROUP BY node_id ORDER BY node_id
====
SELECT node_id, quantile_cont(value_double, [0.05, 0.5, 0.95]) AS q FROM events GROUP BY node_id ORDER BY node_id
====
SELECT node_id, quantile_disc(value_double, 0.99) AS p99 FROM events GROUP BY node_id ORDER BY node_id
====
SELECT node_id, approx_quantile(value_double, 0.5) IS NOT NULL AS has_median FROM events GROUP BY node_id ORDER BY 1
====
SELECT node_id, mad(value_double) AS mad FROM events GROUP BY node_id ORDER BY node_id
====
SELECT rank, arg_min(timestamp_ns, value_double) AS worst_at, min(value_double) AS worst
FROM events GROUP BY rank ORDER BY rank
====
SELECT node_id, count(*) FILTER (WHERE value_double < 0.4) AS low, count(*) AS total
FROM events GROUP BY node_id ORDER BY node_id
====
SELECT node_id, sum(CASE WHEN value_double < 0.4 THEN 1 ELSE 0 END) AS low FROM events GROUP BY node_id ORDER BY 1
====
WITH per_node AS (
    SELECT node_id, median(value_double) AS med FROM events GROUP BY node_id
)
SELECT node_id, med, med - (SELECT median(med) FROM per_node) AS delta FROM per_node ORDER BY delta, node_id
====
WITH fleet AS (SELECT median(value_double) AS m FROM events),
     dev AS (SELECT median(abs(value_double - m)) AS mad FROM events, fleet)
SELECT e.node_id, count(*) AS below
FROM events e, fleet, dev
WHERE e.value_double < fleet.m - 3 * dev.mad * 1.4826
GROUP BY e.node_id ORDER BY e.node_id
====
WITH RECURSIVE steps(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM steps WHERE n < 10)
SELECT n, (SELECT count(*) FROM events WHERE rank = n % 8) AS events_on_rank FROM steps ORDER BY n
====
SELECT event_id, rank, value_double,
       lag(value_double) OVER (PARTITION BY rank ORDER BY timestamp_ns, event_id) AS prev
FROM events ORDER BY rank, timestamp_ns, event_id LIMIT 50
====
SELECT rank, timestamp_ns,
       avg(value_double) OVER (PARTITION BY rank ORDER BY timestamp_ns ROWS BETWEEN 4 PRECEDING AND CURRENT ROW) AS ma5
FROM events ORDER BY rank, timestamp_ns LIMIT 40
====
SELECT node_id, rank, value_double,
       row_number() OVER (PARTITION BY node_id ORDER BY value_double, event_id) AS rn
FROM events QUALIFY rn <= 3 ORDER BY node_id, rn
====
SELECT node_id, rank() OVER (ORDER BY median(value_double)) AS r, median(value_double) AS m
FROM events GROUP BY node_id ORDER BY r, node_id
====
SELECT rank, value_double, ntile(4) OVER (ORDER BY value_double, event_id) AS quartile
FROM events ORDER BY value_double, event_id LIMIT 20
====
SELECT causal_chain_id, count(DISTINCT rank) AS ranks, max(timestamp_ns) - min(timestamp_ns) AS spread_ns
FROM events WHERE causal_chain_id IS NOT NULL GROUP BY causal_chain_id ORDER BY spread_ns DESC, causal_chain_id LIMIT 10
====
SELECT causal_chain_id, arg_max(rank, timestamp_ns) AS last_rank
FROM events WHERE causal_chain_id IS NOT NULL GROUP BY 1 ORDER BY 1 LIMIT 20
====
SELECT a.rank AS r1, b.rank AS r2, count(*) AS shared_chains
FROM events a JOIN events b ON a.causal_chain_id = b.causal_chain_id AND a.rank < b.rank
GROUP BY 1, 2 ORDER BY 1, 2
====
SELECT a.node_id, count(*) AS n FROM events a LEFT JOIN events b ON a.event_id = b.event_id AND b.rank = 0
WHERE b.event_id IS NULL GROUP BY 1 ORDER BY 1
====
SELECT e.node_id, n.total FROM (SELECT DISTINCT node_id FROM events) e
JOIN (SELECT node_id, count(*) AS total FROM events GROUP BY node_id) n USING (node_id) ORDER BY 1
====
SELECT n.node_id, x.worst FROM (SELECT DISTINCT node_id FROM events) n,
LATERAL (SELECT min(value_double) AS worst FROM events e WHERE e.node_id = n.node_id) x ORDER BY 1
====
SELECT node_id FROM events WHERE rank = 0 UNION SELECT node_id FROM events WHERE rank = 1 ORDER BY 1
====
SELECT rank FROM events WHERE node_id LIKE '%0' INTERSECT SELECT rank FROM events WHERE value_double > 0.5 ORDER BY 1
====
SELECT DISTINCT rank FROM events EXCEPT SELECT rank FROM events WHERE value_double < 0.4 ORDER BY 1
====
SELECT node_id, count(*) FROM events WHERE node_id IN (SELECT node_id FROM events WHERE value_double < 0.4)
GROUP BY node_id ORDER BY node_id
====
SELECT count(*) FROM events e WHERE EXISTS (SELECT 1 FROM events f WHERE f.causal_chain_id = e.causal_chain_id AND f.rank <> e.rank)
====
SELECT json_extract_string(attrs_json, '$."rankecho.gpu.model"') AS gpu, count(*) FROM events GROUP BY 1 ORDER BY 1
====
SELECT attrs_json->>'$.causal_chain_id' AS chain, count(*) FROM events WHERE attrs_json->>'$.causal_chain_id' IS NOT NULL GROUP BY 1 ORDER BY 1 LIMIT 5
====
SELECT json_keys(attrs_json) AS keys, count(*) FROM events GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 5
====
SELECT json_valid(attrs_json) AS ok, count(*) FROM events GROUP BY 1 ORDER BY 1
====
SELECT json_extract(attrs_json, '$."rankecho.bytes"')::BIGINT AS bytes, count(*) FROM events GROUP BY 1 ORDER BY 1 LIMIT 5
====
SELECT to_timestamp(timestamp_ns // 1000000000) AS t FROM events ORDER BY timestamp_ns LIMIT 3
====
SELECT time_bucket(INTERVAL '1 minute', make_timestamp(timestamp_ns // 1000)) AS minute, node_id, avg(value_double)
FROM events GROUP BY ALL ORDER BY ALL LIMIT 20
====
SELECT (timestamp_ns // 60000000000) * 60 AS minute_s, count(*) FROM events GROUP BY 1 ORDER BY 1
====
SELECT strftime(make_timestamp(min(timestamp_ns) // 1000), '%Y-%m-%d %H:%M:%S') AS first_seen FROM events
====
SELECT node_id, histogram(round(value_double, 1)) AS h FROM events GROUP BY node_id ORDER BY node_id
====
SELECT node_id, list(DISTINCT rank ORDER BY rank) AS ranks FROM events GROUP BY node_id ORDER BY node_id
====
SELECT node_id, string_agg(DISTINCT CAST(rank AS VARCHAR), ',' ORDER BY CAST(rank AS VARCHAR)) AS ranks FROM events GROUP BY 1 ORDER BY 1
====
SELECT unnest([1, 2, 3]) AS x
====
SELECT x, x * x AS sq FROM range(5) t(x)
====
SELECT g FROM generate_series(1, 3) t(g)
====
SELECT r.range AS r, count(e.event_id) AS n FROM range(8) r LEFT JOIN events e ON e.rank = r.range GROUP BY 1 ORDER BY 1
====
SELECT * FROM (VALUES (1, 'a'), (2, 'b')) v(id, name)
====
SELECT struct_pack(node := node_id, n := count(*)) AS s FROM events GROUP BY node_id ORDER BY node_id
====
SELECT {'node': node_id, 'worst': min(value_double)} AS s FROM events GROUP BY node_id ORDER BY node_id
====
SELECT node_id, regexp_extract(node_id, '(\d+)$') AS num FROM events GROUP BY 1 ORDER BY 1
====
SELECT upper(node_id), length(node_id), replace(node_id, '-', '_') FROM events GROUP BY node_id ORDER BY 1
====
SELECT coalesce(value_double, value_int) AS v FROM events ORDER BY v NULLS LAST, event_id LIMIT 5
====
SELECT CAST(value_double AS DECIMAL(6, 3)) AS v FROM events ORDER BY event_id LIMIT 5
====
SELECT value_double::VARCHAR AS v, TRY_CAST(node_id AS INTEGER) AS bad FROM events ORDER BY event_id LIMIT 5
====
SELECT node_id, bool_or(value_double < 0.4) AS any_low, bool_and(value_double > 0) AS all_pos FROM events GROUP BY 1 ORDER BY 1
====
SELECT COLUMNS('value_.*') FROM events ORDER BY event_id LIMIT 3
====
SELECT max(COLUMNS(['rank', 'nranks'])) FROM events
====
SELECT node_id, corr(value_double, rank) AS c, regr_slope(value_double, timestamp_ns) AS slope FROM events GROUP BY 1 ORDER BY 1
====
SELECT e.* FROM events e WHERE e.value_double = (SELECT min(value_double) FROM events) ORDER BY e.event_id
====
SELECT node_id, count(*) AS n FROM events GROUP BY node_id HAVING count(*) > 10 ORDER BY n DESC, node_id
====
SELECT node_id, rank, value_double FROM events ORDER BY value_double ASC, event_id LIMIT 10 OFFSET 2
====
SELECT a.node_id, b.node_id AS later_node FROM events a ASOF JOIN events b ON a.rank = b.rank AND a.timestamp_ns < b.timestamp_ns ORDER BY a.event_id LIMIT 10
====
SELECT 'read the csv' AS note, 'update pending' AS status, 'see /docs' AS where_to
====
SELECT count(*) AS n -- a trailing comment mentioning DELETE is harmless here
FROM events
====
/* header comment */ SELECT count(*) FROM events
====
SELECT node_id, count(*) FROM events WHERE metric_name = 'rankecho.health.score' AND timestamp_ns >= (SELECT max(timestamp_ns) FROM events) - 300000000000 GROUP BY node_id ORDER BY node_id
====
SELECT node_id, avg(value_double) AS load FROM events GROUP BY node_id ORDER BY node_id
====
SELECT node_id, count(*) AS copy, max(rank) AS update FROM events GROUP BY node_id ORDER BY node_id
====
SELECT DISTINCT node_id.upper() AS n FROM events ORDER BY n
====
SELECT extract(epoch FROM '2026-01-01'::TIMESTAMP) AS e
====
SELECT trim(both 'n' FROM node_id) AS t FROM events GROUP BY 1 ORDER BY 1
====
PIVOT (SELECT node_id, metric_name, value_double FROM events) ON metric_name USING avg(value_double) GROUP BY node_id ORDER BY node_id
====
SELECT node_id, round("rankecho.health.score", 6) AS score FROM (PIVOT (SELECT node_id, metric_name, value_double FROM events) ON metric_name USING avg(value_double) GROUP BY node_id) ORDER BY node_id
====
SELECT node_id, "rankecho.health.score" > 0 AS positive FROM (PIVOT (SELECT node_id, metric_name, value_double FROM events) ON metric_name IN ('rankecho.health.score') USING avg(value_double) GROUP BY node_id) ORDER BY node_id
====
UNPIVOT (SELECT event_id, rank, nranks FROM events ORDER BY event_id LIMIT 3) ON rank, nranks INTO NAME k VALUE v ORDER BY event_id, k
====
WITH events AS (SELECT * FROM events WHERE rank = 5) SELECT count(*) AS n FROM events
====
WITH a AS (SELECT node_id FROM events), b AS (SELECT DISTINCT node_id FROM a) SELECT * FROM b ORDER BY node_id
====
WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 5) SELECT sum(n) AS s FROM t
====
SELECT count(*) AS n FROM range(1000000)
====
SELECT len(repeat('ab', 1000)) AS n
====
SELECT * FROM (VALUES ('a', 1), ('b', 2)) t(k, v) ORDER BY k
====
SELECT 'https://example.com/x.csv' AS u FROM events
====
SELECT 'read_csv(''/etc/passwd'')' AS s
====
SELECT count(*) / 60.0 AS "events/s" FROM events
====
SELECT load FROM (SELECT count(*) AS load FROM events) load
====
WITH load AS (SELECT node_id FROM events) SELECT count(*) AS n FROM load
====
SELECT sum(bytes) AS bytes FROM collectives
====
SELECT count(*) AS n FROM events WHERE attrs_json LIKE 'https://%'
====
SELECT count(*) AS n FROM events WHERE metric_name NOT LIKE 'https://%' AND node_id <> 'file://x'
====
SELECT 1 AS copy, 2 AS load, 3 AS "set"
====
WITH "user" AS (SELECT 1 AS "user") SELECT "user" FROM "user"
