-- Layer 0: the analysis's tuning parameters, in one table (name, value, why). Every threshold, multiplier,
-- quantile, cap, window and minimum count the layers use is read from here with rk_param('name'); unit
-- conversions (1e6 ns per ms), rounding digits and structural constants (0, 1, list positions) stay
-- inline (tests/test_analysis_params.py keeps it so).
-- The table is a session variable, set on every read connection with the macros: a layer's
-- rk_param('x') binds to the value itself (a constant), so a parameter costs what the literal cost (no
-- per-row lookup, and a window's bounds still let scans skip row groups), each value keeps the type it is
-- written with here (6 is an INTEGER, 0.1 a DECIMAL, 1e6 a DOUBLE, as they were inline), and a misspelt
-- name fails when the query is bound. To try another value on one connection (a test, an analyst's own
-- DuckDB):
--   SET VARIABLE rk_params = struct_update(getvariable('rk_params'), noise_sigmas := {'value': 4, 'why': '...'});

-- name: rk_param_table
-- The parameters, by layer: name -> {value, why}.
SET VARIABLE rk_params = {
    -- 10 alignment
    'clock_margin_ns': {'value': 5000000000, 'why': 'the window is read this much wider on each side so node clock offsets do not cut collective instances'},
    'align_sample_calls': {'value': 256, 'why': 'completed calls of an unaligned stream (after its first step) that a realignment fit pairs'},
    'align_pair_window_ns': {'value': CAST(5000000000 AS BIGINT), 'why': 'a sampled call pairs with same-shaped reference calls completed within this much of it'},
    'align_min_share': {'value': 0.5, 'why': 'a shift is eligible when it pairs at least this share of the stream''s sample'},
    'align_max_fit_ns': {'value': 2000000, 'why': 'an eligible shift leaves completions that differ from the reference''s by a constant within this (mean deviation)'},
    'align_tie_ratio': {'value': 1.5, 'why': 'fits within this times the best (plus align_tie_ns) are about as good: the smallest clock offset decides among them'},
    'align_tie_ns': {'value': 50000, 'why': 'see align_tie_ratio'},
    'align_min_steps': {'value': 8, 'why': 'a shift is accepted only with this many steps paired, and an anchor needs more than this many steps: with fewer, a wrong shift fits about as well (the healthy-long-steps failure)'},
    'align_margin_ratio': {'value': 2.0, 'why': 'another shift of the same reference fitting within this times the chosen fit (plus align_margin_ns) leaves the choice ambiguous'},
    'align_margin_ns': {'value': 200000, 'why': 'see align_margin_ratio'},
    'align_offset_margin_ns': {'value': 2000000, 'why': 'a rival shift only counts when its clock offset is less than this much larger than the chosen one''s'},
    -- 20 arrivals
    'clock_sample_rows': {'value': 200000, 'why': 'rows (about 20,000 instances) the clock offsets are the median over; an even sample of the window: more adds nothing to a median'},
    'reference_arrival_quantile': {'value': 0.25, 'why': 'an instance''s reference arrival: up to three quarters of the ranks, a whole late node among them, can be late against it'},
    -- 30 lateness
    'noise_sample_rows': {'value': 500000, 'why': 'arrivals of the primary communicator the noise is measured on, at most (an even sample)'},
    'on_time_quantile': {'value': 0.25, 'why': 'the typical lateness of the on-time ranks: this quantile of the ranks'' typical lateness'},
    'noise_sigmas': {'value': 6, 'why': 'a rank is late when it arrives this many robust standard deviations of the job''s noise after the on-time ranks'},
    'min_threshold_step_share': {'value': 0.1, 'why': 'the lateness threshold is at least this share of the median step'},
    'min_threshold_ns': {'value': 1e6, 'why': 'the lateness threshold is at least this (1 ms)'},
    'visible_min_ns': {'value': 1e6, 'why': 'a rank typically behind, or a lasting sync excess, must reach this (1 ms) and visible_threshold_share of the threshold'},
    'visible_threshold_share': {'value': 0.25, 'why': 'see visible_min_ns'},
    'sampled_steps': {'value': 512, 'why': 'in a cluster with a rank behind, every rank''s first call is looked into at about this many steps, for what the peers'' syncs take'},
    'gpu_unexplained_share': {'value': 0.5, 'why': 'a delayed instance is looked into for a slow GPU when its delay exceeds the step''s largest host lateness by this share of the threshold'},
    'gpu_peer_quantile': {'value': 0.25, 'why': 'a rank''s sync time before calling is compared with this quantile of the instance''s ranks, so a whole node''s slow GPUs stand out'},
    'gpu_most_sync_share': {'value': 0.5, 'why': 'a GPU is named when its sync excess is at least this share of the instance''s largest (a node of slow GPUs has each named)'},
    'gpu_excess_share': {'value': 0.5, 'why': 'and when that excess is at least this share of the threshold'},
    'gpu_min_peer_sync_ns': {'value': 1e6, 'why': 'the peers'' sync time a lasting slow GPU''s implied lateness is measured against must be at least this (1 ms)'},
    -- 40 episodes
    'cause_max_episodes': {'value': 256, 'why': 'the causes of a rank''s latest this many episodes are looked into (the rest keep a NULL cause)'},
    'cause_peers': {'value': 8, 'why': 'on-time peers whose pre-call windows the late rank''s is compared with, at most'},
    'default_window_ns': {'value': 500000000, 'why': 'the pre-call window of a call without the agent''s summary or a previous step'},
    -- 50 stragglers
    'node_share': {'value': 0.75, 'why': 'a node is the straggler when at least this share of its ranks were late at the same step'},
    'node_min_ranks': {'value': 2, 'why': 'and at least this many of them'},
    'node_similar_share': {'value': 0.5, 'why': 'by similar amounts: the least late at least this share of the latest (one rank''s noise beside another''s stall is not the node)'},
    'crowd_late_share': {'value': 0.5, 'why': 'a rank of another node at least this share as late at the same step counts toward a crowd'},
    'crowd_min_ranks': {'value': 2, 'why': 'an episode with this many such ranks is crowded (the whole machine hiccuped): not evidence against the rank'},
    'lone_min_thresholds': {'value': 10, 'why': 'one uncrowded episode this many thresholds late that held others back names a straggler'},
    'min_clear_episodes': {'value': 3, 'why': 'else it needs this many uncrowded episodes'},
    'min_evidence_thresholds': {'value': 6, 'why': 'adding up to this many thresholds of lateness'},
    'min_period_confidence': {'value': 0.7, 'why': 'and standing out from the background: a period of at least this confidence'},
    'background_factor': {'value': 3, 'why': 'or at least this many times the uncrowded episodes of the median rank (plus background_margin): busy machines make every rank late now and then'},
    'background_margin': {'value': 2, 'why': 'see background_factor'},
    -- 60 failures
    'hang_min_ns': {'value': CAST(20000000000 AS BIGINT), 'why': 'an open instance is a hang when older than this and hang_steps steps: NCCL''s watchdog is minutes, a data-loader hiccup seconds; below the max(30 s, 10 steps) a hang must be named within, with a margin for the agents'' 10 s pending timeout and a poll'},
    'hang_steps': {'value': 8, 'why': 'see hang_min_ns (a slow job''s steps can be long)'},
    -- 65 links
    'link_lag_share': {'value': 0.5, 'why': 'a rank lags at a slow step when its lag excess reaches this share of the threshold'},
    'link_node_share': {'value': 0.5, 'why': 'a node is named for a slow link where at least this share of its ranks lag'},
    'link_min_steps': {'value': 3, 'why': 'a link needs this many slow steps to be named (fewer are listed as isolated episodes)'},
    'link_min_partners': {'value': 2, 'why': 'a rank is named by its send/recv pairs when its slow pairs have at least this many partners (with one, both ends are as suspect)'},
    -- 70 stacks
    'stack_lead_frames': {'value': 4, 'why': 'frames in a leading-frames line'},
    'stack_lookback_s': {'value': 60, 'why': 'how long before a window an interval may have begun'},
    'stack_min_distinct_share': {'value': 0.05, 'why': 'a stack is distinctive when its excess on the late rank is at least this share of the late rank''s stack-carried time'},
    'stack_slack_ns': {'value': 1000, 'why': 'a window''s end is matched with its call''s enter within this (a window rebuilt from the corrected clock may be off by a rounding)'}
};

-- name: rk_param
-- The value of the parameter called name (a constant of the type it is written with in rk_param_table).
CREATE OR REPLACE TEMP MACRO rk_param(name) AS getvariable('rk_params')[name].value;

-- name: rk_params
-- The parameter table: one row per tuning parameter of the analysis (name, value as a DOUBLE, why), in
-- the order of the layers that use them; on a connection where one was changed, its current value.
CREATE OR REPLACE TEMP MACRO rk_params() AS TABLE
SELECT name, CAST(p.value AS DOUBLE) AS value, p.why
FROM (UNPIVOT (SELECT unnest(getvariable('rk_params'))) ON COLUMNS(*) INTO NAME name VALUE p);
