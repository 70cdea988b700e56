-- Layer 6b: slow links. Every rank arrives on time, yet the collective takes longer: a congested or
-- degraded NIC, a slow NVLink. An instance's transfer time is its completion (done_c, the earliest
-- completion any rank saw: the return of the sync that covered it) less its last arrival, both on the
-- corrected clocks of rk_arrivals. A slot (communicator, position in the step) does the same work every
-- step, so its typical transfer is its median; an instance is slow when its transfer exceeds that by the
-- noise threshold (rk_lateness's threshold_ns) beyond the largest lateness, host or GPU side, of any rank
-- at that step: a late rank's later collectives complete late too (the wait for it is the straggler's,
-- not the link's), and a busy machine makes some rank a little late at most steps.
-- Completion comes from syncs, so the collectives one sync covers share it: a slow communicator makes
-- the step's other collectives on that stream look slow too. What tells the nodes apart is who
-- finished late: each rank's last completion of the step against the step's earliest, above its own
-- typical lag (lag excess). A node whose ranks mostly lag (node_share), more than any other node and
-- not every node alike, is named; when the data singles out nobody (one communicator over every node,
-- slow for all alike), the episode is reported with node_id NULL. The link is inter-node (a NIC, the
-- network) when an instance over every node took the threshold longer than usual (its completion is the
-- earliest rank's: only a slower transfer of its own moves it), or no intra-node one was slow; intra-node
-- (NVLink, PCIe) otherwise.

-- name: rk_link_tuning
-- Every number the slow-link analysis is tuned by, in one place: a rank lags at a slow step when its lag
-- excess reaches lag_fraction x threshold_ns; a node is named where at least node_share of its ranks lag;
-- a link needs min_steps slow steps to be named (fewer are listed as isolated episodes).
CREATE OR REPLACE TEMP MACRO rk_link_tuning() AS TABLE
SELECT 0.5 AS lag_fraction, 0.5 AS node_share, 3 AS min_steps;

-- name: rk_link_rows
-- One row per (complete instance, rank) of rk_lateness, with its instance's verdict: ranks (n) and nodes
-- (cluster_nodes: the most any instance spans), first_c (its first arrival), transfer_ns (completion less
-- last arrival), its slot's typical transfer (median), extra_ns over it, the largest lateness at its step
-- (step_late_ns, host or GPU side), slow, threshold_ns and steps; first marks one row per instance (its
-- lowest rank's). And the rank's lag at the step: lag_ns, its last completion of the step less the step's
-- earliest rank's, and lag_excess_ns above its own median lag (a rank always last to finish is not slow).
-- One macro, so rk_links reads rk_lateness once.
CREATE OR REPLACE TEMP MACRO rk_link_rows(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
WITH l AS MATERIALIZED (
    SELECT cluster_id, comm_key, seq_g, step, pos, node_id, rank, first_rank, enter_c, done_c, complete_c,
           host_late_ns, gpu_late_ns, threshold_ns, steps
    FROM rk_lateness(start_ns, end_ns, cluster, min_late_ms, job := job)
),
inst AS MATERIALIZED (
    SELECT cluster_id, comm_key, seq_g, any_value(step) AS step, any_value(pos) AS pos, count(*) AS n,
           count(DISTINCT node_id) AS nodes, CAST(min(enter_c) AS BIGINT) AS first_c,
           CAST(any_value(done_c) - max(enter_c) AS BIGINT) AS transfer_ns,
           max(greatest(host_late_ns, coalesce(gpu_late_ns, 0))) AS late_ns,
           any_value(threshold_ns) AS threshold_ns, any_value(steps) AS steps
    FROM l GROUP BY cluster_id, comm_key, seq_g
),
wide AS (SELECT cluster_id, max(nodes) AS cluster_nodes FROM inst GROUP BY ALL),
slot AS (SELECT cluster_id, comm_key, pos, median(transfer_ns) AS typical_ns FROM inst GROUP BY ALL),
step_late AS (SELECT cluster_id, step, greatest(max(late_ns), 0) AS step_late_ns FROM inst GROUP BY ALL),
judged AS MATERIALIZED (
    SELECT i.*, w.cluster_nodes, CAST(s.typical_ns AS BIGINT) AS typical_ns,
           CAST(i.transfer_ns - s.typical_ns AS BIGINT) AS extra_ns, t.step_late_ns,
           i.step IS NOT NULL AND i.transfer_ns - s.typical_ns - t.step_late_ns >= i.threshold_ns AS slow
    FROM inst i
    JOIN slot s ON s.cluster_id = i.cluster_id AND s.comm_key = i.comm_key AND s.pos IS NOT DISTINCT FROM i.pos
    JOIN step_late t ON t.cluster_id = i.cluster_id AND t.step IS NOT DISTINCT FROM i.step
    JOIN wide w ON w.cluster_id = i.cluster_id
),
done AS (  -- each rank's last completion of each step
    SELECT cluster_id, step, rank, max(complete_c) AS done_c
    FROM l WHERE step IS NOT NULL AND complete_c IS NOT NULL GROUP BY ALL
),
lags AS (SELECT *, done_c - min(done_c) OVER (PARTITION BY cluster_id, step) AS lag_ns FROM done),
excess AS (
    SELECT cluster_id, step, rank, lag_ns, lag_ns - median(lag_ns) OVER (PARTITION BY cluster_id, rank) AS lag_excess_ns
    FROM lags
)
SELECT l.node_id, l.rank, l.rank = l.first_rank AS first, j.*,
       CAST(x.lag_ns AS BIGINT) AS lag_ns, CAST(x.lag_excess_ns AS BIGINT) AS lag_excess_ns
FROM l
JOIN judged j USING (cluster_id, comm_key, seq_g)
LEFT JOIN excess x ON x.cluster_id = l.cluster_id AND x.step = l.step AND x.rank = l.rank;

-- name: rk_links
-- One row per slow link (kind 'link'), named by node (node_id NULL: not localised), with the columns
-- rk_stragglers gives a straggler: ranks (the node's), episodes and episode_list ({step, causal_chain_id
-- of the slowest instance, timestamp_ns = its first arrival, late_by_ms = the extra transfer, side and
-- cause 'link', ranks that finished late, crowded false}), median/p95/max extra transfer (ms), period and
-- its confidence (the commonest gap between slow steps, the share of gaps that are it), cause
-- 'slow_link', imposed_gpu_s (the extra transfer times the ranks that waited in it, shared among the
-- nodes named at a step), significant (min_steps slow steps), share of steps; and inter_node,
-- communicators (those with slow instances: the slowed ones and those sharing a sync with them),
-- transfer_ms / typical_transfer_ms (of each step's slowest instance, medians over the episodes).
CREATE OR REPLACE TEMP MACRO rk_links(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
WITH r AS MATERIALIZED (SELECT * FROM rk_link_rows(start_ns, end_ns, cluster, min_late_ms, job := job)),
i AS (SELECT * FROM r WHERE first),  -- one row per instance
waited AS (SELECT cluster_id, step, count(DISTINCT rank) AS n FROM r WHERE slow GROUP BY ALL),
slow_steps AS MATERIALIZED (  -- per step with a slow instance: its slowest, the slow communicators
    SELECT cluster_id, step, max(extra_ns) FILTER (WHERE slow) AS extra_ns,
           arg_max(comm_key || ':' || seq_g, extra_ns) FILTER (WHERE slow) AS causal_chain_id,
           min(first_c) FILTER (WHERE slow) AS timestamp_ns,
           arg_max(transfer_ns, extra_ns) FILTER (WHERE slow) AS transfer_ns,
           arg_max(typical_ns, extra_ns) FILTER (WHERE slow) AS typical_ns, any_value(threshold_ns) AS threshold_ns,
           any_value(steps) AS steps, list(DISTINCT comm_key) FILTER (WHERE slow) AS comms,
           bool_or(nodes = cluster_nodes AND nodes > 1 AND extra_ns >= threshold_ns)
               OR NOT bool_or(slow AND nodes = 1) AS inter_node
    FROM i GROUP BY cluster_id, step HAVING bool_or(slow)
),
slow_waited AS (SELECT s.*, w.n FROM slow_steps s JOIN waited w USING (cluster_id, step)),  -- n: ranks that waited
lagging AS (  -- per slow step and node: the share of its ranks that finished late
    SELECT g.cluster_id, g.step, g.node_id, list(g.rank ORDER BY g.rank) AS node_ranks,
           list(g.rank ORDER BY g.rank) FILTER (WHERE g.lag_excess_ns >= t.lag_fraction * s.threshold_ns) AS late_ranks,
           count(*) FILTER (WHERE g.lag_excess_ns >= t.lag_fraction * s.threshold_ns) / count(*) AS share
    FROM (SELECT DISTINCT cluster_id, step, node_id, rank, lag_excess_ns FROM r) g
    JOIN slow_steps s USING (cluster_id, step) CROSS JOIN rk_link_tuning() t
    GROUP BY ALL
),
ranked AS (  -- each node against the step's largest share (top) and how many nodes reach it
    SELECT *, count(*) FILTER (WHERE share >= 0.999 * top) OVER w AS at_top
    FROM (SELECT *, max(share) OVER w AS top, count(*) OVER w AS nodes FROM lagging WINDOW w AS (PARTITION BY cluster_id, step))
    WINDOW w AS (PARTITION BY cluster_id, step)
),
named AS (  -- the nodes the data singles out at each slow step
    SELECT r.cluster_id, r.step, r.node_id, r.node_ranks, coalesce(r.late_ranks, []) AS late_ranks,
           count(*) OVER (PARTITION BY r.cluster_id, r.step) AS named_nodes
    FROM ranked r CROSS JOIN rk_link_tuning() t
    WHERE r.share >= t.node_share AND r.share >= 0.999 * r.top AND r.at_top < r.nodes
),
entity_steps AS (  -- one row per (link, slow step): a named node, or NULL when nobody is singled out
    SELECT s.*, n.node_id, coalesce(n.node_ranks, []) AS node_ranks, coalesce(n.late_ranks, []) AS late_ranks,
           coalesce(n.named_nodes, 1) AS named_nodes
    FROM slow_waited s LEFT JOIN named n USING (cluster_id, step)
),
gaps AS (
    SELECT cluster_id, node_id, step - lag(step) OVER (PARTITION BY cluster_id, node_id ORDER BY step) AS gap
    FROM entity_steps
),
periods AS (
    SELECT cluster_id, node_id, mode(gap) AS period, count(*) FILTER (WHERE gap = mode_gap) / count(*) AS period_confidence
    FROM (SELECT *, mode(gap) OVER (PARTITION BY cluster_id, node_id) AS mode_gap FROM gaps WHERE gap IS NOT NULL)
    GROUP BY ALL
)
SELECT e.cluster_id, 'link' AS kind, e.node_id, CAST(NULL AS INTEGER) AS rank,
       list_sort(list_distinct(flatten(list(e.node_ranks)))) AS ranks, count(*) AS episodes,
       list({'step': e.step, 'causal_chain_id': e.causal_chain_id, 'timestamp_ns': e.timestamp_ns,
             'late_by_ms': round(e.extra_ns / 1e6, 3), 'side': 'link', 'cause': 'slow_link', 'ranks': e.late_ranks,
             'crowded': false} ORDER BY e.step) AS episode_list,
       median(e.extra_ns) / 1e6 AS median_late_ms, quantile_cont(e.extra_ns, 0.95) / 1e6 AS p95_late_ms,
       max(e.extra_ns) / 1e6 AS max_late_ms, 'slow_link' AS cause, 'link' AS side,
       map(['slow_link'], [count(*)]) AS causes,
       sum(e.extra_ns * e.n / e.named_nodes) / 1e9 AS imposed_gpu_s,
       count(*) >= any_value(t.min_steps) AS significant, count(*) / any_value(e.steps) AS share,
       any_value(p.period) AS period, any_value(p.period_confidence) AS period_confidence,
       bool_and(e.inter_node) AS inter_node, list_distinct(flatten(list(e.comms))) AS communicators,
       median(e.transfer_ns) / 1e6 AS transfer_ms, median(e.typical_ns) / 1e6 AS typical_transfer_ms
FROM entity_steps e
CROSS JOIN rk_link_tuning() t
LEFT JOIN periods p ON p.cluster_id = e.cluster_id AND p.node_id IS NOT DISTINCT FROM e.node_id
GROUP BY e.cluster_id, e.node_id
ORDER BY e.cluster_id, significant DESC, imposed_gpu_s DESC, e.node_id;
