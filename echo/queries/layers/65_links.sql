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
-- (NVLink, PCIe) otherwise. Two nodes named at a step are one link between the two (node_id the lesser
-- name, peer_node_id the greater), and so is an unlocalised inter-node link in a cluster of two nodes: both
-- ends of the one slow path finished late alike, so the pair is the most the data singles out (per-peer
-- timing, e.g. NCCL's profiler plugin, could tell its two ends apart).
-- Send/recv pairs (pipeline stages) time a link between two ranks: a pair's transfer is its completion (the
-- earlier of its two ends' completions) less the later of its two arrivals, and its slot (communicator,
-- sender, receiver) does the same work every step. Where pairs are slow at a step, they name the link: the
-- one rank in every slow pair (a rank's own link, when its slow pairs have more than one partner), else the
-- one node in every slow pair (a NIC), else the nodes of the slow pairs (two: the link between them).
-- Jobs without send/recv are judged by their collectives alone, as above.
-- The numbers (parameters link_* of rk_params): a rank lags at a slow step when its lag excess reaches
-- link_lag_share x threshold_ns; a node is named where at least link_node_share of its ranks lag; a link
-- needs link_min_steps slow steps to be named (fewer are listed as isolated episodes); a rank is named by
-- its send/recv pairs when its slow pairs have at least link_min_partners partners (with one, both ends
-- of the pair are as suspect).

-- name: rk_link_rows
-- One row per (complete instance, rank) of rk_lateness, with its instance's verdict: ranks (n) and nodes
-- (cluster_nodes: the most any instance spans), first_c (its first arrival), transfer_ns (completion less
-- last arrival), its slot's typical transfer (median), extra_ns over it, the largest lateness at its step
-- (step_late_ns, host or GPU side), slow, threshold_ns and steps; first marks one row per instance (its
-- lowest rank's). And the rank's lag at the step: lag_ns, its last completion of the step less the step's
-- earliest rank's, and lag_excess_ns above its own median lag (a rank always last to finish is not slow);
-- the row's own arrival (rank_enter_c), lateness (rank_host_late_ns, rank_gpu_late_ns) and clock offset.
-- One macro, so rk_links reads rk_lateness once.
CREATE OR REPLACE TEMP MACRO rk_link_rows(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
WITH l AS MATERIALIZED (
    SELECT cluster_id, comm_key, seq_g, step, pos, node_id, rank, first_rank, enter_c, done_c, complete_c,
           host_late_ns, gpu_late_ns, threshold_ns, steps, clock_offset_ns
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
       CAST(x.lag_ns AS BIGINT) AS lag_ns, CAST(x.lag_excess_ns AS BIGINT) AS lag_excess_ns,
       l.enter_c AS rank_enter_c, l.host_late_ns AS rank_host_late_ns, l.gpu_late_ns AS rank_gpu_late_ns,
       l.clock_offset_ns
FROM l
JOIN judged j USING (cluster_id, comm_key, seq_g)
LEFT JOIN excess x ON x.cluster_id = l.cluster_id AND x.step = l.step AND x.rank = l.rank;

-- name: rk_link_pair_rows
-- One row per send/recv pair in the window whose two ends were both seen once (the agent gives both the
-- same causal_chain_id, <comm>.<sender>><receiver>:<n>): its communicator, its slot (the chain id less
-- its number: the same sender and receiver every step), the sender's and receiver's rank and node, and
-- each end's arrival (enter) and completion on its node's clock (rk_links puts them on the reference's).
CREATE OR REPLACE TEMP MACRO rk_link_pair_rows(start_ns, end_ns, cluster, job := NULL) AS TABLE
SELECT cluster_id, causal_chain_id, any_value(comm_id) AS comm_id,
       regexp_replace(causal_chain_id, ':[0-9]+$', '') AS slot,
       any_value(rank) FILTER (WHERE op = 'ncclSend') AS src_rank,
       any_value(node_id) FILTER (WHERE op = 'ncclSend') AS src_node,
       any_value(rank) FILTER (WHERE op = 'ncclRecv') AS dst_rank,
       any_value(node_id) FILTER (WHERE op = 'ncclRecv') AS dst_node,
       any_value(enter_ns) FILTER (WHERE op = 'ncclSend') AS src_enter_ns,
       any_value(enter_ns) FILTER (WHERE op = 'ncclRecv') AS dst_enter_ns,
       any_value(complete_ns) FILTER (WHERE op = 'ncclSend') AS src_complete_ns,
       any_value(complete_ns) FILTER (WHERE op = 'ncclRecv') AS dst_complete_ns
FROM collectives
WHERE op IN ('ncclSend', 'ncclRecv') AND causal_chain_id IS NOT NULL AND rank IS NOT NULL
  AND (start_ns IS NULL OR enter_ns >= start_ns) AND (end_ns IS NULL OR enter_ns < end_ns)
  AND (cluster IS NULL OR cluster_id = cluster)
  AND (job IS NULL OR job_id = job)
GROUP BY cluster_id, causal_chain_id
HAVING count(*) FILTER (WHERE op = 'ncclSend') = 1 AND count(*) FILTER (WHERE op = 'ncclRecv') = 1;

-- name: rk_links
-- One row per slow link (kind 'link'), named by node (node_id NULL: not localised), by node pair (the link
-- between node_id and peer_node_id; NULL otherwise) or, where send/recv pairs single one out, by rank
-- (rank and its node_id; NULL otherwise), with the columns rk_stragglers gives a straggler: ranks (the
-- node's, both of a pair's nodes'), episodes and episode_list ({step, causal_chain_id
-- of the slowest instance, timestamp_ns = its first arrival, late_by_ms = the extra transfer, side and
-- cause 'link', ranks that finished late, crowded false}), median/p95/max extra transfer (ms), period and
-- its confidence (the commonest gap between slow steps, the share of gaps that are it), cause
-- 'slow_link', imposed_gpu_s (the extra transfer times the ranks that waited in it, shared among the
-- links named at a step), significant (link_min_steps slow steps), share of steps; and inter_node,
-- communicators (those with slow instances: the slowed ones and those sharing a sync with them),
-- transfer_ms / typical_transfer_ms (of each step's slowest instance, medians over the episodes). A step
-- with slow send/recv pairs is judged by them (its episode: the slowest pair's chain id and extra
-- transfer, timestamp_ns the step's first collective arrival, ranks those of the slow pairs).
CREATE OR REPLACE TEMP MACRO rk_links(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
WITH r AS MATERIALIZED (SELECT * FROM rk_link_rows(start_ns, end_ns, cluster, min_late_ms, job := job)),
own_slow AS (  -- slow one-node instances that are slow on their own: each of whose ranks was in no slow
    -- multi-node instance at the step that was at least as slow (less the threshold). A one-node instance
    -- completed by the same sync as a slow inter-node one (the agent sees the sync's return) waited for it:
    -- on a node with a slow NIC its intra-node communicators look as slow as its inter-node ones.
    SELECT a.cluster_id, a.comm_key, a.seq_g
    FROM r a LEFT JOIN r m ON m.cluster_id = a.cluster_id AND m.step = a.step AND m.rank = a.rank
                          AND m.slow AND m.nodes > 1 AND m.extra_ns + m.threshold_ns >= a.extra_ns
    WHERE a.slow AND a.nodes = 1
    GROUP BY ALL HAVING count(m.rank) = 0
),
i AS (  -- one row per instance; own: a slow one-node instance that no inter-node one explains
    SELECT r.*, o.comm_key IS NOT NULL AS own
    FROM r LEFT JOIN own_slow o USING (cluster_id, comm_key, seq_g) WHERE r.first
),
waited AS (SELECT cluster_id, step, count(DISTINCT rank) AS n FROM r WHERE slow GROUP BY ALL),
slow_steps AS MATERIALIZED (  -- per step with a slow instance: its slowest, the slow communicators
    SELECT cluster_id, step, max(extra_ns) FILTER (WHERE slow) AS extra_ns,
           arg_max(comm_key || ':' || seq_g, extra_ns) FILTER (WHERE slow) AS causal_chain_id,
           min(first_c) FILTER (WHERE slow) AS timestamp_ns,
           arg_max(transfer_ns, extra_ns) FILTER (WHERE slow) AS transfer_ns,
           arg_max(typical_ns, extra_ns) FILTER (WHERE slow) AS typical_ns, any_value(threshold_ns) AS threshold_ns,
           any_value(steps) AS steps, list(DISTINCT comm_key) FILTER (WHERE slow) AS comms,
           bool_or(nodes = cluster_nodes AND nodes > 1 AND extra_ns >= threshold_ns)
               OR NOT bool_or(slow AND nodes = 1 AND own) AS inter_node
    FROM i GROUP BY cluster_id, step HAVING bool_or(slow)
),
slow_waited AS (SELECT s.*, w.n FROM slow_steps s JOIN waited w USING (cluster_id, step)),  -- n: ranks that waited
lagging AS (  -- per slow step and node: the share of its ranks that finished late
    SELECT g.cluster_id, g.step, g.node_id, list(g.rank ORDER BY g.rank) AS node_ranks,
           list(g.rank ORDER BY g.rank) FILTER (WHERE g.lag_excess_ns >= rk_param('link_lag_share') * s.threshold_ns)
               AS late_ranks,
           count(*) FILTER (WHERE g.lag_excess_ns >= rk_param('link_lag_share') * s.threshold_ns) / count(*) AS share
    FROM (SELECT DISTINCT cluster_id, step, node_id, rank, lag_excess_ns FROM r) g
    JOIN slow_steps s USING (cluster_id, step)
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
    FROM ranked r
    WHERE r.share >= rk_param('link_node_share') AND r.share >= 0.999 * r.top AND r.at_top < r.nodes
),
collective_steps AS (  -- one row per (link, slow step): a named node, or NULL when nobody is singled out
    SELECT s.*, n.node_id, CAST(NULL AS INTEGER) AS rank, coalesce(n.node_ranks, []) AS node_ranks,
           coalesce(n.late_ranks, []) AS late_ranks, coalesce(n.named_nodes, 1) AS named_nodes
    FROM slow_waited s LEFT JOIN named n USING (cluster_id, step)
),
pair_rows AS MATERIALIZED (SELECT * FROM rk_link_pair_rows(start_ns, end_ns, cluster, job := job)),
rp AS MATERIALIZED (  -- the rows of clusters with send/recv pairs: the rest pay nothing below
    SELECT * FROM r SEMI JOIN (SELECT DISTINCT cluster_id FROM pair_rows) USING (cluster_id)
),
cluster_ctx AS (
    SELECT cluster_id, any_value(threshold_ns) AS threshold_ns, any_value(steps) AS steps FROM rp GROUP BY ALL
),
offsets AS (SELECT cluster_id, node_id, any_value(clock_offset_ns) AS offset_ns FROM rp GROUP BY ALL),
marks AS (  -- each rank's last collective call of each step: its send/recv calls before it are that step's
    SELECT cluster_id, rank, step, max(rank_enter_c) AS mark_c FROM rp WHERE step IS NOT NULL GROUP BY ALL
),
pairs AS MATERIALIZED (  -- each send/recv pair on the reference clock, placed in its sender's step
    SELECT q.*, m.step, CAST(q.done_c - q.last_c AS BIGINT) AS transfer_ns
    FROM (SELECT p.*, p.src_enter_ns - so.offset_ns AS src_c,
                 greatest(p.src_enter_ns - so.offset_ns, p.dst_enter_ns - ro.offset_ns) AS last_c,
                 least(p.src_complete_ns - so.offset_ns, p.dst_complete_ns - ro.offset_ns) AS done_c
          FROM pair_rows p
          JOIN offsets so ON so.cluster_id = p.cluster_id AND so.node_id = p.src_node
          JOIN offsets ro ON ro.cluster_id = p.cluster_id AND ro.node_id = p.dst_node) q
    ASOF JOIN marks m ON m.cluster_id = q.cluster_id AND m.rank = q.src_rank AND m.mark_c >= q.src_c
    WHERE q.done_c IS NOT NULL
),
pair_judged AS MATERIALIZED (  -- slow: the transfer exceeds its slot's median by the noise threshold
    SELECT x.*, CAST(x.transfer_ns - s.typical_ns AS BIGINT) AS extra_ns,
           CAST(s.typical_ns AS BIGINT) AS typical_ns, c.threshold_ns, c.steps,
           x.transfer_ns - s.typical_ns >= c.threshold_ns AS slow
    FROM pairs x
    JOIN (SELECT cluster_id, slot, median(transfer_ns) AS typical_ns FROM pairs GROUP BY ALL) s
      USING (cluster_id, slot)
    JOIN cluster_ctx c USING (cluster_id)
    WHERE x.step IS NOT NULL
),
rank_links AS MATERIALIZED (  -- per step and rank pair: slow when every transfer between them was, both ways
    -- (a GPU that reaches its forward send late, or a stalled host, slows one direction only)
    SELECT cluster_id, step, least(src_rank, dst_rank) AS rank_a, greatest(src_rank, dst_rank) AS rank_b,
           any_value(CASE WHEN src_rank < dst_rank THEN src_node ELSE dst_node END) AS node_a,
           any_value(CASE WHEN src_rank < dst_rank THEN dst_node ELSE src_node END) AS node_b,
           bool_and(slow) AS slow, max(extra_ns) AS extra_ns, arg_max(causal_chain_id, extra_ns) AS causal_chain_id,
           arg_max(transfer_ns, extra_ns) AS transfer_ns, arg_max(typical_ns, extra_ns) AS typical_ns,
           any_value(comm_id) AS comm_id, any_value(threshold_ns) AS threshold_ns, any_value(steps) AS steps
    FROM pair_judged GROUP BY ALL
),
pair_steps AS MATERIALIZED (  -- per step with a slow rank pair: its slowest, the communicators and ranks
    SELECT cluster_id, step, max(extra_ns) AS extra_ns, arg_max(causal_chain_id, extra_ns) AS causal_chain_id,
           arg_max(transfer_ns, extra_ns) AS transfer_ns, arg_max(typical_ns, extra_ns) AS typical_ns,
           any_value(threshold_ns) AS threshold_ns, any_value(steps) AS steps, list(DISTINCT comm_id) AS comms,
           bool_or(node_a <> node_b) AS inter_node, count(*) AS n_slow,
           list_sort(list_distinct(flatten(list([rank_a, rank_b])))) AS pair_ranks
    FROM rank_links WHERE slow GROUP BY ALL
),
ends AS (  -- each slow rank pair's two ends
    SELECT cluster_id, step, rank_a AS rank, node_a AS node_id, rank_b AS partner FROM rank_links WHERE slow
    UNION ALL
    SELECT cluster_id, step, rank_b, node_b, rank_a FROM rank_links WHERE slow
),
by_rank AS (  -- steps whose slow pairs all share one rank, with at least link_min_partners partners: its link
    SELECT c.cluster_id, c.step, c.node_id, c.rank
    FROM (SELECT h.*, count(*) OVER (PARTITION BY h.cluster_id, h.step) AS candidates
          FROM (SELECT cluster_id, step, rank, any_value(node_id) AS node_id,
                       count(*) AS hits, count(DISTINCT partner) AS partners
                FROM ends GROUP BY ALL) h
          JOIN pair_steps s USING (cluster_id, step) WHERE h.hits = s.n_slow) c
    WHERE c.candidates = 1 AND c.partners >= rk_param('link_min_partners')
),
by_node AS (  -- the other steps: the node(s) in the most slow pairs (one in all of them: its NIC)
    SELECT cluster_id, step, node_id
    FROM (SELECT h.*, max(hits) OVER (PARTITION BY cluster_id, step) AS top
          FROM (SELECT cluster_id, step, node_id,
                       count(DISTINCT (least(rank, partner), greatest(rank, partner))) AS hits  -- slow pairs
                FROM ends GROUP BY ALL) h
          ANTI JOIN by_rank b USING (cluster_id, step))
    WHERE hits = top
),
node_ranks AS (SELECT cluster_id, node_id, list_sort(list_distinct(list(rank))) AS ranks FROM rp GROUP BY ALL),
pair_named AS (
    SELECT cluster_id, step, node_id, rank, [rank] AS node_ranks, 1 AS named_nodes FROM by_rank
    UNION ALL
    SELECT b.cluster_id, b.step, b.node_id, CAST(NULL AS INTEGER), coalesce(k.ranks, []),
           count(*) OVER (PARTITION BY b.cluster_id, b.step)
    FROM by_node b LEFT JOIN node_ranks k USING (cluster_id, node_id)
),
step_first AS (SELECT cluster_id, step, min(first_c) AS first_c FROM rp WHERE first GROUP BY ALL),
named_steps AS (  -- a step's slow pairs name its link when it has any; its collectives otherwise
    SELECT * FROM collective_steps ANTI JOIN pair_steps USING (cluster_id, step)
    UNION ALL BY NAME
    SELECT s.cluster_id, s.step, s.extra_ns, s.causal_chain_id, f.first_c AS timestamp_ns, s.transfer_ns,
           s.typical_ns, s.threshold_ns, s.steps, s.comms, s.inter_node, len(s.pair_ranks) AS n, n.node_id,
           n.rank, n.node_ranks, s.pair_ranks AS late_ranks, n.named_nodes
    FROM pair_steps s JOIN pair_named n USING (cluster_id, step) LEFT JOIN step_first f USING (cluster_id, step)
),
cluster_pair AS (  -- a cluster of exactly two nodes: the pair an unlocalised inter-node link lies between
    SELECT cluster_id, min(node_id) AS node_a, max(node_id) AS node_b,
           list_sort(list_distinct(list(rank))) AS ranks
    FROM r GROUP BY ALL HAVING count(DISTINCT node_id) = 2
),
linked AS (  -- each named row's link: exactly two nodes named by node at a step are one link between the two,
    -- and so is an unlocalised inter-node link in a two-node cluster (node_id the lesser name, peer_node_id
    -- the greater); a single node, a rank, or an unlocalised link over more nodes has no peer
    SELECT e.* EXCLUDE (node_id, node_ranks),
           CASE WHEN e.two_named THEN min(e.node_id) OVER w WHEN e.unlocalised THEN c.node_a
                ELSE e.node_id END AS node_id,
           CASE WHEN e.two_named THEN max(e.node_id) OVER w WHEN e.unlocalised THEN c.node_b END AS peer_node_id,
           CASE WHEN e.unlocalised AND c.ranks IS NOT NULL THEN c.ranks ELSE e.node_ranks END AS node_ranks
    FROM (SELECT *, rank IS NULL AND node_id IS NOT NULL AND named_nodes = 2 AS two_named,
                 node_id IS NULL AND inter_node AS unlocalised
          FROM named_steps) e
    LEFT JOIN cluster_pair c USING (cluster_id)
    WINDOW w AS (PARTITION BY e.cluster_id, e.step)
),
entity_steps AS (  -- one row per (link, slow step); named_links: the links named at the step
    SELECT *, count(*) OVER (PARTITION BY cluster_id, step) AS named_links
    FROM (SELECT * EXCLUDE (node_ranks, late_ranks, named_nodes, two_named, unlocalised),
                 list_sort(list_distinct(flatten(list(node_ranks)))) AS node_ranks,
                 list_sort(list_distinct(flatten(list(late_ranks)))) AS late_ranks
          FROM linked GROUP BY ALL)
),
gaps AS (
    SELECT cluster_id, node_id, peer_node_id, rank,
           step - lag(step) OVER (PARTITION BY cluster_id, node_id, peer_node_id, rank ORDER BY step) AS gap
    FROM entity_steps
),
periods AS (
    SELECT cluster_id, node_id, peer_node_id, rank, mode(gap) AS period,
           count(*) FILTER (WHERE gap = mode_gap) / count(*) AS period_confidence
    FROM (SELECT *, mode(gap) OVER (PARTITION BY cluster_id, node_id, peer_node_id, rank) AS mode_gap
          FROM gaps WHERE gap IS NOT NULL)
    GROUP BY ALL
)
SELECT e.cluster_id, 'link' AS kind, e.node_id, e.peer_node_id, e.rank,
       list_sort(list_distinct(flatten(list(e.node_ranks)))) AS ranks, count(*) AS episodes,
       list({'step': e.step, 'causal_chain_id': e.causal_chain_id, 'timestamp_ns': e.timestamp_ns,
             'late_by_ms': round(e.extra_ns / 1e6, 3), 'side': 'link', 'cause': 'slow_link', 'ranks': e.late_ranks,
             'crowded': false} ORDER BY e.step) AS episode_list,
       median(e.extra_ns) / 1e6 AS median_late_ms, quantile_cont(e.extra_ns, 0.95) / 1e6 AS p95_late_ms,
       max(e.extra_ns) / 1e6 AS max_late_ms, 'slow_link' AS cause, 'link' AS side,
       map(['slow_link'], [count(*)]) AS causes,
       sum(e.extra_ns * e.n / e.named_links) / 1e9 AS imposed_gpu_s,
       count(*) >= rk_param('link_min_steps') AS significant, count(*) / any_value(e.steps) AS share,
       any_value(p.period) AS period, any_value(p.period_confidence) AS period_confidence,
       bool_and(e.inter_node) AS inter_node, list_distinct(flatten(list(e.comms))) AS communicators,
       median(e.transfer_ns) / 1e6 AS transfer_ms, median(e.typical_ns) / 1e6 AS typical_transfer_ms
FROM entity_steps e
LEFT JOIN periods p ON p.cluster_id = e.cluster_id AND p.node_id IS NOT DISTINCT FROM e.node_id
                   AND p.peer_node_id IS NOT DISTINCT FROM e.peer_node_id AND p.rank IS NOT DISTINCT FROM e.rank
GROUP BY e.cluster_id, e.node_id, e.peer_node_id, e.rank
ORDER BY e.cluster_id, significant DESC, imposed_gpu_s DESC, e.node_id, e.peer_node_id, e.rank;
