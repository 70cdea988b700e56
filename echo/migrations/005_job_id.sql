-- Schema v5: which job each typed row belongs to. The agent stamps `rankecho.job.id` on every point of
-- a traced process (agent/jobid.py, docs/contract.md "Job identity"); staging.sql copies it here so the
-- analysis can keep one job's ranks 0..N-1 apart from another's. Points without one (older agents,
-- seed-style producers) get '' : one unknown job, analysed exactly as before.
-- Existing rows are backfilled from events' attrs_json (a store migrating from v1 is staged afterwards
-- with the current staging.sql, which fills the column itself).
ALTER TABLE collectives ADD COLUMN job_id VARCHAR DEFAULT '';
ALTER TABLE host_activity ADD COLUMN job_id VARCHAR DEFAULT '';
UPDATE collectives SET job_id = coalesce(json_extract_string(e.attrs_json, '$."rankecho.job.id"'), '')
FROM events e
WHERE e.event_id = collectives.event_id;
UPDATE host_activity SET job_id = coalesce(json_extract_string(e.attrs_json, '$."rankecho.job.id"'), '')
FROM events e
WHERE e.event_id = CASE WHEN host_activity.kind = 'runq' THEN left(host_activity.event_id, length(host_activity.event_id) - 5)
                        ELSE host_activity.event_id END;
