-- Layer 3: who was late, by how much, on which side, and what the instance's delay cost.
-- Host side: a rank is late at an instance when it entered threshold_ns or more after the instance's
-- reference arrival. The threshold comes from the job's own noise: 6 robust standard deviations
-- (noise_sigmas) of how far a rank's arrivals stray from its own typical lateness, above the typical
-- lateness of the on-time ranks (a rank or a whole node late at every step stands out instead of widening the noise),
-- at least 10% of the median step and 1 ms (min_threshold_*), and never below min_late_ms when the caller
-- gives one. Every such number is a parameter of rk_params (00_params.sql).
-- GPU side: a collective call only enqueues work; the GPU reaches the collective later. An instance
-- is delayed when it completed later after its on-time arrivals than the same slot (communicator,
-- position in the step) does in instances where nobody was late; a delay that no host's lateness
-- explains (at any instance of the step: a collective queued on a GPU behind another communicator's
-- late one inherits its wait) is a GPU arriving late at every rank whose thread spent longer blocked
-- in its own syncs before calling (its GPU was busy with its own work) than the instance's lower
-- quartile of ranks did, by at least half the threshold and at least half the largest such excess (so
-- a node whose GPUs are all slow has each of them named, and is then seen as a node). A run-queue
-- wait behind another workload that ended a sync is the CPU's doing, not the GPU's: it is taken out.
-- A GPU slow at every step leaves no healthy instance to measure a delay against: when a rank
-- typically arrives behind the others, the lateness its sync excess implies (lasting) names it instead.
-- Only a step's first collective on a communicator (pos 0) has such a sync window; the later ones
-- inherit the step's verdict in rk_episodes.

-- name: rk_pre_calls
-- The pre-call windows the node agents summarised (collectives.pre_*, agent/window.py), keyed as the
-- layers key a call: its stream and seq. Callers bound enter_ns (node clock) so the scan skips row groups.
-- A call with a summary is explained from it; one without (an older agent) from host_activity.
CREATE OR REPLACE TEMP MACRO rk_pre_calls() AS TABLE
SELECT stream_key AS stream, seq, enter_ns, pre_window_ns, pre_allocator_ns, pre_slow_gpu_ns, pre_memcpy_ns,
       pre_cpu_contention_ns, pre_sleeping_ns, pre_presync_ns
FROM collectives
WHERE pre_window_ns IS NOT NULL;

-- name: rk_lateness
-- One row per (instance, rank) of complete instances (every member of the communicator reported):
-- the arrival of rk_arrivals; the cluster's noise (noise_median_ns, noise_sigma_ns), median step
-- (step_ns), steps seen and threshold_ns; host_late (host_late_ns >= threshold_ns); the instance's
-- wait (done_c - ref_c), its slot's healthy wait and delay_ns (the difference: what the on-time ranks
-- waited beyond normal, or the lateness a lasting slow GPU implies); the rank's own sync time before
-- calling (presync_ns: delayed instances, and every first call of the primary in a cluster with a rank
-- behind) and, when a GPU rule names the rank, gpu_late_ns (the delay, or the implied lateness).
CREATE OR REPLACE TEMP MACRO rk_lateness(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
WITH a AS MATERIALIZED (
    SELECT * FROM rk_arrivals(start_ns, end_ns, cluster, job := job) WHERE n = comm_size AND n >= 2
),
sampled AS MATERIALIZED (  -- the primary communicator's arrivals (about 500,000 of them at most)
    SELECT cluster_id, rank, host_late_ns FROM a
    WHERE on_primary
      AND seq_g % greatest(1, (SELECT count(*) FROM a) // rk_param('noise_sample_rows')) = 0
),
typical AS (SELECT cluster_id, rank, median(host_late_ns) AS typical_ns FROM sampled GROUP BY ALL),
levels AS (SELECT cluster_id, quantile_cont(typical_ns, rk_param('on_time_quantile')) AS level_ns FROM typical GROUP BY ALL),
lateness AS (  -- the noise: how far a rank's arrivals stray from its own typical lateness (a rank, or a
    -- whole node, late at every step is what is looked for, not noise), above the typical lateness of
    -- the on-time ranks (the lower quartile of the ranks' typical lateness)
    SELECT cluster_id, any_value(l.level_ns) AS noise_median_ns,
           1.4826 * mad(s.host_late_ns - t.typical_ns) AS noise_sigma_ns
    FROM sampled s JOIN typical t USING (cluster_id, rank) JOIN levels l USING (cluster_id)
    GROUP BY cluster_id
),
inst AS MATERIALIZED (  -- one row per instance (its lowest rank's)
    SELECT inst_key, cluster_id, comm_key, seq_g, pos, step, on_primary, last_late_ns, done_c, ref_c,
           done_c - ref_c AS wait_ns, done_c - ref_c - last_late_ns AS after_last_ns
    FROM a WHERE rank = first_rank
),
step_done AS (SELECT cluster_id, step, min(done_c) AS done_c FROM inst WHERE on_primary GROUP BY ALL),
steps AS (
    SELECT cluster_id, count(*) AS steps, median(gap) AS step_ns,
           min(done_c) AS first_done_c, max(done_c) AS last_done_c
    FROM (SELECT *, done_c - lag(done_c) OVER (PARTITION BY cluster_id ORDER BY step) AS gap FROM step_done)
    GROUP BY cluster_id
),
noise AS (
    SELECT s.*, l.noise_median_ns, l.noise_sigma_ns,
           CAST(greatest(coalesce(min_late_ms, 0) * 1e6,
                         coalesce(l.noise_median_ns + rk_param('noise_sigmas') * l.noise_sigma_ns, 0),
                         coalesce(rk_param('min_threshold_step_share') * s.step_ns, 0), rk_param('min_threshold_ns'))
                AS BIGINT) AS threshold_ns
    FROM steps s LEFT JOIN lateness l USING (cluster_id)
),
slot AS (  -- the slot's normal wait: over instances nobody was late at (else after the last arrival)
    SELECT i.cluster_id, i.comm_key, i.pos,
           coalesce(median(i.wait_ns) FILTER (WHERE i.last_late_ns < z.threshold_ns), median(i.after_last_ns))
               AS healthy_wait_ns
    FROM inst i JOIN noise z USING (cluster_id) GROUP BY ALL
),
step_late AS (  -- the latest host arrival at any instance of the step, on any communicator
    SELECT cluster_id, step, max(last_late_ns) AS step_last_late_ns FROM inst GROUP BY ALL
),
delayed AS MATERIALIZED (
    SELECT i.inst_key, i.cluster_id, i.comm_key, i.seq_g, i.pos, i.last_late_ns, i.wait_ns, s.healthy_wait_ns,
           i.wait_ns - s.healthy_wait_ns AS delay_ns, z.threshold_ns, t.step_last_late_ns
    FROM inst i
    JOIN noise z USING (cluster_id)
    JOIN slot s ON s.cluster_id = i.cluster_id AND s.comm_key = i.comm_key AND s.pos IS NOT DISTINCT FROM i.pos
    LEFT JOIN step_late t ON t.cluster_id = i.cluster_id AND t.step IS NOT DISTINCT FROM i.step
),
behind AS (  -- ranks that typically arrive behind most others (by 1 ms and a quarter of the threshold):
    -- a GPU slow at every step (its sync before calling returns later) leaves no healthy instance to
    -- measure a delay against. Every first call of theirs is looked into, and every rank's at one step
    -- in every_k (about 512 steps), for what the peers' syncs take
    SELECT t.cluster_id, t.rank, greatest(1, z.steps // rk_param('sampled_steps')) AS every_k
    FROM typical t JOIN levels l USING (cluster_id) JOIN noise z USING (cluster_id)
    WHERE t.typical_ns - l.level_ns
          >= greatest(rk_param('visible_min_ns'), z.threshold_ns * rk_param('visible_threshold_share'))
),
suspects AS MATERIALIZED (  -- pos-0 rows of instances with a delay their host lateness does not explain
    -- (suspect: every rank), and the primary's first calls of ranks behind and, at sampled steps, of
    -- every rank of their cluster; each with the end of its previous step (the completion of its
    -- stream's previous call; the few rows on the right, the side a hash join builds)
    SELECT s.cluster_id, s.inst_key, s.rank, s.thread_key, b.complete_c AS prev_c, s.enter_c, s.clock_offset_ns,
           s.suspect, s.sampled, s.stream, s.seq
    FROM a b
    JOIN (SELECT * FROM (
              SELECT a.*, d.delay_ns >= d.threshold_ns
                          AND d.delay_ns - greatest(d.last_late_ns, d.step_last_late_ns, 0)
                              >= d.threshold_ns * rk_param('gpu_unexplained_share')
                          AS suspect,
                     r.rank IS NOT NULL AS candidate,
                     coalesce(a.on_primary AND a.step % k.every_k = 0, false) AS sampled
              FROM a JOIN (SELECT * FROM delayed WHERE pos = 0) d USING (inst_key)
              LEFT JOIN (SELECT DISTINCT cluster_id, every_k FROM behind) k ON k.cluster_id = a.cluster_id
              LEFT JOIN behind r ON r.cluster_id = a.cluster_id AND r.rank = a.rank)
          WHERE suspect OR sampled OR (candidate AND on_primary)) s
      ON b.stream = s.stream AND b.seq = s.seq - 1
    WHERE b.complete_c IS NOT NULL
),
summarised AS MATERIALIZED (  -- the suspects whose agent sent the window's sync time with the call
    SELECT s.inst_key, s.rank, coalesce(p.pre_presync_ns, 0) AS presync_ns
    FROM suspects s
    JOIN rk_pre_calls() p ON p.stream = s.stream AND p.seq = s.seq
    WHERE p.enter_ns BETWEEN (SELECT min(enter_c + clock_offset_ns) FROM suspects)
                         AND (SELECT max(enter_c + clock_offset_ns) FROM suspects)
),
suspect_buckets AS MATERIALIZED (  -- each window once per 1 s bucket an overlapping interval can start in
    -- (raw clock): its own and the one before (an interval that began earlier is not looked for: the
    -- bound keeps the bucket join small, whatever the longest interval in the store)
    SELECT s.*, unnest(range((s.prev_c + s.clock_offset_ns) // 1000000000 - 1,
                             (s.enter_c + s.clock_offset_ns) // 1000000000 + 1)) AS bucket
    FROM suspects s ANTI JOIN summarised m USING (inst_key, rank)
),
presync AS (  -- time blocked in syncs, less the run-queue waits (behind another workload) that ended them
    SELECT s.cluster_id, s.inst_key, s.rank, s.suspect, s.sampled,
           coalesce(sum((least(h.end_ns - s.clock_offset_ns, s.enter_c)
                         - greatest(h.start_ns - s.clock_offset_ns, s.prev_c))
                        * CASE WHEN h.kind = 'sync' THEN 1 ELSE -1 END) FILTER (WHERE h.kind IS NOT NULL), 0)
               AS presync_ns  -- (least/greatest skip NULLs: a bucket without an interval must add nothing)
    FROM suspect_buckets s
    LEFT JOIN (SELECT * FROM host_activity  -- a constant bound the scan can skip row groups with
               WHERE (kind = 'sync' OR (kind = 'runq' AND cuda_call IN ('cudaStreamSynchronize',
                                                                         'cudaDeviceSynchronize',
                                                                         'cudaEventSynchronize')))
                 AND start_bucket BETWEEN (SELECT min(bucket) FROM suspect_buckets)
                                      AND (SELECT max(bucket) FROM suspect_buckets)) h
      ON h.thread_key = s.thread_key AND h.start_bucket = s.bucket
     AND h.end_ns - s.clock_offset_ns > s.prev_c AND h.start_ns - s.clock_offset_ns < s.enter_c
    GROUP BY ALL
    UNION ALL BY NAME
    SELECT s.cluster_id, s.inst_key, s.rank, s.suspect, s.sampled, m.presync_ns
    FROM suspects s JOIN summarised m USING (inst_key, rank)
),
excess AS (  -- against the lower quartile of the instance's ranks, so a whole node's slow GPUs stand out
    -- (meaningful where every rank was looked into: suspect or sampled instances)
    SELECT *, sync_excess_ns >= rk_param('gpu_most_sync_share') * max(sync_excess_ns) OVER (PARTITION BY inst_key)
                  AS most_sync
    FROM (SELECT *, quantile_cont(presync_ns, rk_param('gpu_peer_quantile')) OVER (PARTITION BY inst_key)
                     AS quartile_sync_ns,
                 presync_ns - quartile_sync_ns AS sync_excess_ns
          FROM presync)
),
peer_sync AS (  -- per cluster with a rank behind: the lower quartile's sync time at a typical sampled step
    SELECT cluster_id, median(quartile_sync_ns) AS quartile_sync_ns FROM excess WHERE sampled GROUP BY ALL
),
implied AS MATERIALIZED (  -- the first calls of ranks behind: the lateness at the collective that the
    -- rank's sync excess implies. A GPU f = presync / quartile times slower than its peers' over the work
    -- the sync waited for is f times slower over the work queued after it too: of what remained from its
    -- call to the completion, 1 - 1/f is its own extra time
    SELECT e.inst_key, e.cluster_id, e.rank, e.presync_ns - q.quartile_sync_ns AS sync_excess_ns,
           CAST(e.presync_ns - q.quartile_sync_ns
                + (1 - q.quartile_sync_ns / e.presync_ns) * (a.done_c - a.enter_c) AS BIGINT) AS implied_late_ns
    FROM excess e
    SEMI JOIN behind r ON r.cluster_id = e.cluster_id AND r.rank = e.rank
    JOIN (SELECT e.inst_key, CASE WHEN e.sampled THEN e.quartile_sync_ns ELSE p.quartile_sync_ns END
                             AS quartile_sync_ns
          FROM (SELECT DISTINCT cluster_id, inst_key, sampled, quartile_sync_ns FROM excess) e
          JOIN peer_sync p USING (cluster_id)) q USING (inst_key)
    JOIN a USING (inst_key, rank)
    WHERE NOT e.suspect AND a.on_primary AND q.quartile_sync_ns >= rk_param('gpu_min_peer_sync_ns')
      AND e.presync_ns > q.quartile_sync_ns
),
lasting AS (  -- a GPU slow at most steps: the rank's median implied lateness reaches the threshold, and
    -- its median sync excess is a visible part of it (1 ms, a quarter of the threshold); named at the
    -- first calls where both hold
    SELECT i.inst_key, i.rank, i.implied_late_ns
    FROM implied i
    JOIN (SELECT a.cluster_id, a.rank, median(coalesce(i.implied_late_ns, 0)) AS implied_ns,
                 median(coalesce(i.sync_excess_ns, 0)) AS excess_ns
          FROM a SEMI JOIN behind r ON r.cluster_id = a.cluster_id AND r.rank = a.rank
          LEFT JOIN implied i USING (inst_key, rank)
          WHERE a.on_primary AND a.pos = 0
          GROUP BY ALL) r ON r.cluster_id = i.cluster_id AND r.rank = i.rank
    JOIN noise z ON z.cluster_id = i.cluster_id
    WHERE r.implied_ns >= z.threshold_ns
      AND r.excess_ns >= greatest(rk_param('visible_min_ns'), z.threshold_ns * rk_param('visible_threshold_share'))
      AND i.implied_late_ns >= z.threshold_ns
      AND i.sync_excess_ns >= greatest(rk_param('visible_min_ns'), z.threshold_ns * rk_param('visible_threshold_share'))
),
lasting_delay AS (SELECT inst_key, max(implied_late_ns) AS implied_late_ns FROM lasting GROUP BY ALL)
SELECT a.*, z.noise_median_ns, z.noise_sigma_ns, z.step_ns, z.steps, z.first_done_c, z.last_done_c,
       z.threshold_ns, a.host_late_ns >= z.threshold_ns AS host_late,
       d.wait_ns, d.healthy_wait_ns, greatest(d.delay_ns, ld.implied_late_ns) AS delay_ns, e.presync_ns,
       e.sync_excess_ns,
       CASE WHEN e.suspect AND e.most_sync AND e.sync_excess_ns >= z.threshold_ns * rk_param('gpu_excess_share')
            THEN d.delay_ns
            ELSE g.implied_late_ns END AS gpu_late_ns
FROM a
JOIN noise z USING (cluster_id)
JOIN delayed d USING (inst_key)
LEFT JOIN excess e USING (inst_key, rank)
LEFT JOIN lasting g USING (inst_key, rank)
LEFT JOIN lasting_delay ld USING (inst_key);

-- name: rk_noise
-- Per cluster: the noise the lateness threshold comes from (median and robust sigma of the primary
-- communicator's arrival lateness), the median step time, the steps seen and threshold_ns.
CREATE OR REPLACE TEMP MACRO rk_noise(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
SELECT DISTINCT cluster_id, noise_median_ns, noise_sigma_ns, step_ns, steps, threshold_ns
FROM rk_lateness(start_ns, end_ns, cluster, min_late_ms, job := job);

-- name: rk_instances
-- One row per complete collective instance: arrival spread, the last rank on the host side and by how
-- much, the last rank on the GPU side when the GPU rule names one, the delay (what the on-time ranks
-- waited beyond the slot's normal wait) and the imposed wait in GPU-seconds (the delay times the
-- ranks that were not late).
CREATE OR REPLACE TEMP MACRO rk_instances(start_ns, end_ns, cluster, min_late_ms := NULL, job := NULL) AS TABLE
SELECT cluster_id, comm_key, seq_g, comm_key || ':' || seq_g AS causal_chain_id, any_value(step) AS step,
       any_value(pos) AS pos, count(*) AS ranks,
       CAST(min(ref_c) AS BIGINT) AS timestamp_ns,
       (max(enter_c) - min(enter_c)) / 1e6 AS spread_ms,
       arg_max(node_id, enter_c) AS last_host_node, arg_max(rank, enter_c) AS last_host_rank,
       max(host_late_ns) / 1e6 AS last_host_late_ms,
       arg_max(node_id, gpu_late_ns) AS last_gpu_node, arg_max(rank, gpu_late_ns) AS last_gpu_rank,
       max(gpu_late_ns) / 1e6 AS gpu_late_ms,
       any_value(delay_ns) / 1e6 AS delay_ms,
       any_value(threshold_ns) / 1e6 AS threshold_ms,
       count(*) FILTER (WHERE host_late OR gpu_late_ns IS NOT NULL) AS late_ranks,
       CASE WHEN bool_or(host_late OR gpu_late_ns IS NOT NULL)
            THEN greatest(any_value(delay_ns), 0) / 1e9
                 * count(*) FILTER (WHERE NOT host_late AND gpu_late_ns IS NULL) ELSE 0 END AS imposed_gpu_s
FROM rk_lateness(start_ns, end_ns, cluster, min_late_ms, job := job)
GROUP BY cluster_id, comm_key, seq_g;
