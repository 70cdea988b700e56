-- Layer 5: the stragglers, each with its pattern, cause and cost.
-- A straggler is a rank, or a whole node when at least three quarters of a multi-rank node's ranks
-- (two at least) were late at the same step by similar amounts (the least late at least half the
-- latest: one rank's noise beside another's stall is not the node); the cause is then the node (its
-- CPU, PCIe, NIC, storage or a daemon), not one rank.
-- Period: the spacing of its episodes in steps: among the gaps between consecutive episodes, the one
-- whose grid (phase and spacing) covers the most episodes with the fewest holes; confidence =
-- coverage x purity x (1 - 1/hits), so two episodes alone give at most 0.5.
-- Significance (named as a straggler, not listed as isolated late episodes): an episode is crowded when
-- at the same step two or more ranks of other nodes were at least half as late (the whole machine
-- hiccuped). Over its uncrowded episodes, a straggler needs one of ten thresholds of lateness that
-- held others back (it imposed a wait: a rank late beside a later one is not a lone culprit), or
-- three or more adding up to six thresholds that also stand out from the job's background of late
-- episodes: a period of confidence >= 0.7, or at least 3 x + 2 the episodes the median rank had
-- (busy machines make every rank late now and then; a straggler is late more, or regularly). These
-- numbers are parameters of rk_params: node_*, crowd_*, lone_min_thresholds, min_*, background_*.
-- What-if: the job's time over the window as if this straggler had been on time is the actual time
-- minus the delays of the steps it held up; slowdown = actual / what-if.

-- name: rk_stragglers
-- One row per straggler (kind 'rank' or 'node'), ordered by imposed wait, with the cluster's
-- context on every row (a cluster with no late episode appears once with kind NULL): episodes (list
-- of {step, causal_chain_id, timestamp_ns, late_by_ms, side, cause, ranks, crowded}, oldest first), share of
-- steps, median/p95/max lateness, period and its confidence, the dominant cause and side with
-- counts per cause, the median breakdown of the late rank's pre-call window against its peers',
-- imposed GPU-seconds, and the what-if step time.
CREATE OR REPLACE TEMP MACRO rk_stragglers(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
WITH e AS MATERIALIZED (SELECT * FROM rk_episodes(start_ns, end_ns, cluster, min_late_ms, job := job)),
context AS (
    SELECT DISTINCT cluster_id, noise_median_ns, noise_sigma_ns, cluster_threshold_ns AS threshold_ns, step_ns,
           steps, first_done_c, last_done_c, cluster_ranks, reference_node
    FROM e
),
ep AS (SELECT * FROM e WHERE step IS NOT NULL),
node_steps AS (  -- steps at which most of a multi-rank node was late together, by similar amounts
    SELECT cluster_id, node_id, step FROM ep
    GROUP BY ALL
    HAVING any_value(node_size) >= rk_param('node_min_ranks')
       AND count(DISTINCT rank)
           >= greatest(rk_param('node_min_ranks'), ceil(rk_param('node_share') * any_value(node_size)))
       AND min(late_by_ns) >= rk_param('node_similar_share') * max(late_by_ns)
),
crowds AS (  -- per episode: ranks of other nodes at least half as late at the same step
    SELECT a.cluster_id, a.node_id, a.rank, a.step, count(b.rank) AS crowd
    FROM ep a LEFT JOIN ep b
      ON b.cluster_id = a.cluster_id AND b.step = a.step AND b.node_id <> a.node_id
     AND b.late_by_ns >= rk_param('crowd_late_share') * a.late_by_ns
    GROUP BY ALL
),
entity_steps AS (  -- one episode per straggler and step (a node's: its worst rank, its largest imposed wait)
    SELECT ep.cluster_id, CASE WHEN ns.step IS NULL THEN 'rank' ELSE 'node' END AS kind, ep.node_id,
           CASE WHEN ns.step IS NULL THEN ep.rank END AS rank, ep.step,
           arg_max(ep.causal_chain_id, ep.late_by_ns) AS causal_chain_id, min(ep.timestamp_ns) AS timestamp_ns,
           max(ep.late_by_ns) AS late_by_ns, max(ep.threshold_ns) AS threshold_ns,
           mode(ep.cause) AS cause, mode(ep.side) AS side, max(ep.imposed_gpu_ns) AS imposed_gpu_ns,
           max(ep.delay_ns) AS delay_ns, list(DISTINCT ep.rank ORDER BY ep.rank) AS ranks,
           arg_max(ep.spent_ns, ep.late_by_ns) AS spent_ns, arg_max(ep.peers_ns, ep.late_by_ns) AS peers_ns,
           min(c.crowd) >= rk_param('crowd_min_ranks') AS crowded
    FROM ep
    LEFT JOIN node_steps ns USING (cluster_id, node_id, step)
    JOIN crowds c USING (cluster_id, node_id, rank, step)
    GROUP BY ALL
),
gaps AS (
    SELECT cluster_id, kind, node_id, rank,
           step - lag(step) OVER (PARTITION BY cluster_id, kind, node_id, rank ORDER BY step) AS gap
    FROM entity_steps
),
candidates AS (SELECT DISTINCT cluster_id, kind, node_id, rank, gap AS period FROM gaps WHERE gap > 0),
phases AS (
    SELECT c.cluster_id, c.kind, c.node_id, c.rank, c.period, s.step % c.period AS phase, count(*) AS hits,
           min(s.step) AS first_step, max(s.step) AS last_step
    FROM candidates c JOIN entity_steps s
      ON s.cluster_id = c.cluster_id AND s.kind = c.kind AND s.node_id = c.node_id
     AND s.rank IS NOT DISTINCT FROM c.rank
    GROUP BY ALL
),
totals AS (SELECT cluster_id, kind, node_id, rank, count(*) AS n FROM entity_steps GROUP BY ALL),
periods AS (
    SELECT DISTINCT ON (p.cluster_id, p.kind, p.node_id, p.rank) p.cluster_id, p.kind, p.node_id, p.rank,
           p.period, p.hits / ((p.last_step - p.first_step) // p.period + 1) * p.hits / t.n * (1 - 1 / p.hits)
               AS period_confidence
    FROM phases p JOIN totals t
      ON t.cluster_id = p.cluster_id AND t.kind = p.kind AND t.node_id = p.node_id AND t.rank IS NOT DISTINCT FROM p.rank
    ORDER BY p.cluster_id, p.kind, p.node_id, p.rank, period_confidence DESC, p.period
),
causes AS (
    SELECT cluster_id, kind, node_id, rank, map(list(cause), list(n)) AS causes
    FROM (SELECT cluster_id, kind, node_id, rank, cause, count(*) AS n FROM entity_steps
          WHERE cause IS NOT NULL GROUP BY ALL)
    GROUP BY ALL
),
stragglers AS (
    SELECT s.cluster_id, s.kind, s.node_id, s.rank, list_distinct(flatten(list(s.ranks))) AS ranks,
           count(*) AS episodes,
           list({'step': s.step, 'causal_chain_id': s.causal_chain_id, 'timestamp_ns': s.timestamp_ns,
                 'late_by_ms': round(s.late_by_ns / 1e6, 3), 'side': s.side, 'cause': s.cause, 'ranks': s.ranks,
                 'crowded': s.crowded} ORDER BY s.step) AS episode_list,
           median(s.late_by_ns) / 1e6 AS median_late_ms, quantile_cont(s.late_by_ns, 0.95) / 1e6 AS p95_late_ms,
           max(s.late_by_ns) / 1e6 AS max_late_ms,
           count(*) FILTER (WHERE NOT s.crowded) AS clear_episodes,
           coalesce(sum(s.late_by_ns / s.threshold_ns) FILTER (WHERE NOT s.crowded), 0) AS evidence,
           coalesce(max(s.late_by_ns / s.threshold_ns) FILTER (WHERE NOT s.crowded), 0) AS worst,
           mode(s.cause) AS cause, mode(s.side) AS side,
           sum(s.imposed_gpu_ns) / 1e9 AS imposed_gpu_s,
           sum(greatest(s.delay_ns, 0)) AS delay_ns,
           {'allocator': median(s.spent_ns.allocator), 'slow_gpu': median(s.spent_ns.slow_gpu),
            'memcpy': median(s.spent_ns.memcpy), 'cpu_contention': median(s.spent_ns.cpu_contention),
            'sleeping': median(s.spent_ns.sleeping), 'host_compute': median(s.spent_ns.host_compute)} AS spent_ns,
           {'allocator': median(s.peers_ns.allocator), 'slow_gpu': median(s.peers_ns.slow_gpu),
            'memcpy': median(s.peers_ns.memcpy), 'cpu_contention': median(s.peers_ns.cpu_contention),
            'sleeping': median(s.peers_ns.sleeping), 'host_compute': median(s.peers_ns.host_compute)} AS peers_ns
    FROM entity_steps s
    GROUP BY s.cluster_id, s.kind, s.node_id, s.rank
),
background AS (  -- per cluster: the median rank's uncrowded late episodes (ranks without any count 0)
    SELECT x.cluster_id,
           coalesce(list_median(list_resize(list(s.clear_episodes) FILTER (WHERE s.kind = 'rank'),
                                            any_value(x.cluster_ranks), 0)), 0) AS typical
    FROM context x LEFT JOIN stragglers s USING (cluster_id)
    GROUP BY x.cluster_id
),
judged AS (
    SELECT s.*, p.period, p.period_confidence, c.causes, b.typical AS background_episodes,
           (s.worst >= rk_param('lone_min_thresholds') AND s.imposed_gpu_s > 0)
           OR (s.clear_episodes >= rk_param('min_clear_episodes') AND s.evidence >= rk_param('min_evidence_thresholds')
               AND (coalesce(p.period_confidence, 0) >= rk_param('min_period_confidence')
                    OR s.clear_episodes >= rk_param('background_factor') * b.typical + rk_param('background_margin')))
               AS significant
    FROM stragglers s
    JOIN background b USING (cluster_id)
    LEFT JOIN periods p
      ON p.cluster_id = s.cluster_id AND p.kind = s.kind AND p.node_id = s.node_id AND p.rank IS NOT DISTINCT FROM s.rank
    LEFT JOIN causes c
      ON c.cluster_id = s.cluster_id AND c.kind = s.kind AND c.node_id = s.node_id AND c.rank IS NOT DISTINCT FROM s.rank
)
SELECT x.*, j.* EXCLUDE (cluster_id, delay_ns),
       j.episodes / x.steps AS share,
       (x.last_done_c - x.first_done_c) / 1e6 AS window_ms,
       (x.last_done_c - x.first_done_c) / 1e6 / nullif(x.steps - 1, 0) AS step_ms_actual,
       (x.last_done_c - x.first_done_c - j.delay_ns) / 1e6 / nullif(x.steps - 1, 0) AS step_ms_if_on_time,
       (x.last_done_c - x.first_done_c) / nullif(x.last_done_c - x.first_done_c - j.delay_ns, 0) AS slowdown
FROM context x
LEFT JOIN judged j USING (cluster_id)
ORDER BY x.cluster_id, j.significant DESC NULLS LAST, j.imposed_gpu_s DESC NULLS LAST, j.node_id, j.rank;
