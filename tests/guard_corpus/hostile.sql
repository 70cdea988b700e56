# Hostile queries: the guard must refuse every one. Entries are separated by lines of '===='.
# File access in every spelling, writes, catalog/settings introspection, multiple statements,
# comment/whitespace/case/unicode tricks, nesting in subqueries, CTEs, LATERAL and set operations.
====
SELECT * FROM read_csv('/etc/passwd')
====
SELECT * FROM read_csv_auto('/etc/passwd')
====
SELECT * FROM READ_CSV('/etc/passwd')
====
SELECT * FROM ReAd_CsV('/etc/passwd')
====
SELECT * FROM read_csv ('/etc/passwd')
====
SELECT * FROM read_csv/**/('/etc/passwd')
====
SELECT * FROM "read_csv"('/etc/passwd')
====
SELECT * FROM main.read_csv('/etc/passwd')
====
SELECT * FROM system.main.read_csv('/etc/passwd')
====
SELECT * FROM read_parquet('/tmp/x.parquet')
====
SELECT * FROM read_parquet(['/tmp/a.parquet', '/tmp/b.parquet'])
====
SELECT * FROM parquet_scan('/tmp/x.parquet')
====
SELECT * FROM parquet_metadata('/tmp/x.parquet')
====
SELECT * FROM parquet_schema('/tmp/x.parquet')
====
SELECT * FROM parquet_kv_metadata('/tmp/x.parquet')
====
SELECT * FROM parquet_file_metadata('/tmp/x.parquet')
====
SELECT * FROM read_json('/etc/hosts')
====
SELECT * FROM read_json_auto('/etc/hosts')
====
SELECT * FROM read_json_objects('/etc/hosts')
====
SELECT * FROM read_ndjson('/etc/hosts')
====
SELECT * FROM read_ndjson_objects('/etc/hosts')
====
SELECT * FROM read_text('/etc/passwd')
====
SELECT * FROM read_blob('/etc/passwd')
====
SELECT content FROM read_text('/proc/self/environ')
====
SELECT * FROM read_xlsx('/tmp/x.xlsx')
====
SELECT * FROM sniff_csv('/etc/passwd')
====
SELECT * FROM SNIFF_CSV('/etc/passwd')
====
SELECT * FROM glob('/etc/*')
====
SELECT * FROM glob ('/root/**')
====
SELECT * FROM csv_scan('/etc/passwd')
====
SELECT * FROM json_scan('/etc/hosts')
====
SELECT * FROM '/etc/passwd'
====
SELECT * FROM 'events.csv'
====
SELECT * FROM "/etc/passwd"
====
SELECT * FROM "events.parquet"
====
SELECT * FROM 'data/*.parquet'
====
SELECT * FROM ('/etc/passwd')
====
SELECT * FROM events, '/etc/passwd'
====
SELECT * FROM events JOIN '/etc/passwd' ON true
====
SELECT * FROM 's3://bucket/key.parquet'
====
SELECT * FROM 'S3://bucket/key.parquet'
====
SELECT * FROM 'https://example.com/data.csv'
====
SELECT * FROM 'http://169.254.169.254/latest/meta-data/'
====
SELECT * FROM 'gcs://bucket/x.parquet'
====
SELECT * FROM 'gs://bucket/x.parquet'
====
SELECT * FROM 'az://container/x.parquet'
====
SELECT * FROM 'azure://container/x.parquet'
====
SELECT * FROM 'abfss://c@acct.dfs.core.windows.net/x.parquet'
====
SELECT * FROM 'hf://datasets/x/y.parquet'
====
SELECT * FROM 'r2://bucket/x.parquet'
====
SELECT * FROM 'file:///etc/passwd'
====
SELECT * FROM (SELECT * FROM read_csv('/etc/passwd'))
====
SELECT * FROM events WHERE node_id IN (SELECT column0 FROM read_csv('/etc/passwd'))
====
SELECT * FROM events WHERE EXISTS (SELECT 1 FROM read_text('/etc/shadow'))
====
SELECT (SELECT content FROM read_text('/etc/passwd')) AS leak
====
SELECT node_id FROM events ORDER BY (SELECT count(*) FROM read_text('/etc/passwd'))
====
SELECT node_id, count(*) FROM events GROUP BY node_id HAVING count(*) > (SELECT count(*) FROM read_csv('/etc/passwd'))
====
WITH leak AS (SELECT * FROM read_csv('/etc/passwd')) SELECT * FROM leak
====
WITH a AS (SELECT 1), b AS (SELECT * FROM read_text('/etc/passwd')) SELECT * FROM b
====
WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r, read_text('/etc/passwd') WHERE n < 2) SELECT * FROM r
====
SELECT * FROM events e, LATERAL (SELECT * FROM read_text('/etc/passwd')) x
====
SELECT * FROM events e CROSS JOIN LATERAL read_csv(e.node_id)
====
SELECT node_id FROM events UNION SELECT content FROM read_text('/etc/passwd')
====
SELECT node_id FROM events UNION ALL SELECT * FROM '/etc/passwd'
====
SELECT node_id FROM events INTERSECT SELECT content FROM read_text('/etc/passwd')
====
SELECT node_id FROM events EXCEPT SELECT content FROM read_text('/etc/passwd')
====
SELECT * FROM query('SELECT * FROM read_csv(''/etc/passwd'')')
====
SELECT * FROM query_table('events')
====
SELECT * FROM query_table(['events', 'events'])
====
SELECT * FROM query('SELECT 1')
====
SELECT json_execute_serialized_sql(json_serialize_sql('SELECT 1'))
====
SELECT * FROM json_execute_serialized_sql('{}')
====
SELECT * FROM ｒｅａｄ_ｃｓｖ('/etc/passwd')
====
SELECT * FROM read＿csv('/etc/passwd')
====
SELECT * FROM reаd_csv('/etc/passwd')
====
SELECT * FROM rea​d_csv('/etc/passwd')
====
SELECT * FROM read_csv('/etc/passwd')‮
====
SELECT * FROM events WHERE node_id = 'a‮' 
====
SELECT 1 ﻿
====
INSERT INTO events (event_id, timestamp_ns, received_ns, signal, metric_name) VALUES ('x', 1, 1, 'metric', 'm')
====
insert into events select * from events
====
INSERT OR REPLACE INTO events SELECT * FROM events
====
INSERT INTO events BY NAME SELECT * FROM events
====
UPDATE events SET value_double = 0
====
update events set node_id = 'x' where rank = 1
====
DELETE FROM events
====
delete from events where true
====
DELETE FROM events WHERE node_id IN (SELECT node_id FROM events)
====
TRUNCATE events
====
TRUNCATE TABLE events
====
DROP TABLE events
====
DROP TABLE IF EXISTS events
====
DROP VIEW events
====
DROP SCHEMA main CASCADE
====
ALTER TABLE events ADD COLUMN x INTEGER
====
ALTER TABLE events RENAME TO e2
====
ALTER TABLE events DROP COLUMN attrs_json
====
CREATE TABLE t AS SELECT * FROM events
====
CREATE TEMP TABLE t AS SELECT 1
====
CREATE OR REPLACE TABLE events AS SELECT * FROM events LIMIT 0
====
CREATE VIEW v AS SELECT * FROM events
====
CREATE MACRO leak() AS TABLE SELECT * FROM read_text('/etc/passwd')
====
CREATE FUNCTION f(x) AS x + 1
====
CREATE SEQUENCE s
====
CREATE SCHEMA s
====
CREATE INDEX i ON events (node_id)
====
CREATE TYPE mood AS ENUM ('a', 'b')
====
CREATE SECRET (TYPE s3, KEY_ID 'x', SECRET 'y')
====
DROP SECRET s
====
MERGE INTO events USING events AS s ON false WHEN NOT MATCHED THEN INSERT *
====
WITH x AS (SELECT 1) INSERT INTO events SELECT * FROM events
====
WITH x AS (SELECT 1) DELETE FROM events
====
WITH x AS (SELECT 1) UPDATE events SET rank = 0
====
COPY events TO '/tmp/leak.csv'
====
COPY (SELECT * FROM events) TO '/tmp/leak.parquet' (FORMAT parquet)
====
COPY events FROM '/etc/passwd'
====
copy events to 'stdout'
====
EXPORT DATABASE '/tmp/export'
====
IMPORT DATABASE '/tmp/export'
====
ATTACH '/tmp/other.db' AS other
====
ATTACH ':memory:' AS m
====
ATTACH 'https://example.com/x.db' (READ_ONLY)
====
DETACH events
====
USE memory
====
INSTALL httpfs
====
LOAD httpfs
====
FORCE INSTALL httpfs
====
INSTALL spatial FROM community
====
UPDATE EXTENSIONS
====
CALL pragma_version()
====
CALL duckdb_settings()
====
CALL enable_logging()
====
CHECKPOINT
====
FORCE CHECKPOINT
====
VACUUM
====
VACUUM ANALYZE events
====
ANALYZE
====
PRAGMA database_list
====
PRAGMA table_info('events')
====
PRAGMA enable_profiling
====
PRAGMA memory_limit='100GB'
====
SET memory_limit = '100GB'
====
SET enable_external_access = true
====
SET lock_configuration = false
====
SET GLOBAL threads = 1
====
SET VARIABLE x = 1
====
RESET memory_limit
====
RESET ALL
====
BEGIN TRANSACTION
====
BEGIN
====
COMMIT
====
ROLLBACK
====
ABORT
====
END
====
PREPARE p AS SELECT 1
====
EXECUTE p
====
DEALLOCATE p
====
COMMENT ON TABLE events IS 'x'
====
EXPLAIN SELECT * FROM events
====
EXPLAIN ANALYZE SELECT * FROM events
====
DESCRIBE events
====
SHOW TABLES
====
SHOW ALL TABLES
====
SHOW DATABASES
====
SUMMARIZE events
====
SUMMARIZE SELECT * FROM events
====
SELECT * FROM duckdb_settings()
====
SELECT * FROM duckdb_tables()
====
SELECT * FROM duckdb_databases()
====
SELECT * FROM duckdb_extensions()
====
SELECT * FROM duckdb_secrets()
====
SELECT * FROM duckdb_functions()
====
SELECT * FROM duckdb_columns()
====
SELECT * FROM duckdb_views()
====
SELECT * FROM duckdb_memory()
====
SELECT * FROM duckdb_temporary_files()
====
SELECT * FROM duckdb_logs
====
SELECT * FROM duckdb_logs()
====
SELECT * FROM duckdb_settings
====
SELECT * FROM DuckDB_Settings()
====
SELECT * FROM "duckdb_settings"()
====
SELECT * FROM ｄｕｃｋｄｂ_settings()
====
SELECT * FROM information_schema.tables
====
SELECT * FROM information_schema.columns
====
SELECT * FROM INFORMATION_SCHEMA.TABLES
====
SELECT * FROM pg_catalog.pg_tables
====
SELECT * FROM pg_tables
====
SELECT * FROM sqlite_master
====
SELECT * FROM sqlite_schema
====
SELECT * FROM pragma_database_list
====
SELECT * FROM pragma_database_list()
====
SELECT * FROM pragma_table_info('events')
====
SELECT * FROM pragma_storage_info('events')
====
SELECT * FROM pragma_version()
====
SELECT * FROM pragma_metadata_info()
====
SELECT * FROM test_all_types()
====
SELECT * FROM show_databases()
====
SELECT * FROM which_secret('s3://x', 's3')
====
SELECT current_setting('home_directory')
====
SELECT current_setting('memory_limit')
====
SELECT CURRENT_SETTING('temp_directory')
====
SELECT getenv('HOME')
====
SELECT GETENV('RANKECHO_TOKEN')
====
SELECT getvariable('x')
====
SELECT current_database()
====
SELECT current_schema()
====
SELECT current_schemas(true)
====
SELECT current_query()
====
SELECT current_role()
====
SELECT version()
====
SELECT * FROM events WHERE node_id = current_setting('home_directory')
====
SELECT node_id FROM events WHERE node_id IN (SELECT database_name FROM duckdb_databases())
====
SELECT nextval('s')
====
SELECT setval('s', 1)
====
SELECT * FROM system.main.events
====
SELECT * FROM temp.main.events
====
SELECT * FROM other.main.events
====
SELECT * FROM memory.events
====
SELECT * FROM schema_version
====
SELECT * FROM events AT (VERSION => 1)
====
SELECT 1; SELECT 2
====
SELECT 1; DROP TABLE events
====
SELECT 1;DELETE FROM events
====
SELECT 1;;SELECT 2
====
SELECT 1; /* harmless? */ UPDATE events SET rank = 0
====
/* comment first */ DELETE FROM events
====
DELETE/**/FROM/**/events
====
SELECT * FROM events WHERE node_id = E'\x27; DROP TABLE events; --'
====
SELECT E'abc'
====
SELECT $$ DROP TABLE events $$
====
SELECT $tag$x$tag$
====
SELECT U&'\0061'
====
SELECT * FROM U&"\0065vents"
====
SELECT * FROM events WHERE node_id = 'a' UNION SELECT * FROM '/etc/passwd'
====
SELECT * FROM events LIMIT (SELECT count(*) FROM read_csv('/etc/passwd'))
====
SELECT list_transform([1], x -> (SELECT content FROM read_text('/etc/passwd')))
====
SELECT * FROM events WINDOW w AS (ORDER BY (SELECT 1 FROM read_text('/x')))
====
SELECT * FROM (VALUES ((SELECT content FROM read_text('/etc/passwd')))) v(x)
====
SELECT * FROM unnest((SELECT list(content) FROM read_text('/etc/passwd')))
====
SELECT * FROM range((SELECT count(*) FROM glob('/*')))
====
SELECT * FROM events ASOF JOIN read_csv('/etc/passwd') r ON true
====
SELECT * FROM events POSITIONAL JOIN read_text('/etc/passwd')
====
SELECT * FROM events SEMI JOIN read_text('/etc/passwd') r ON true
====
SELECT * FROM events ANTI JOIN '/etc/passwd' r ON true
====
SELECT * FROM events e WHERE e.attrs_json IN (FROM read_text('/etc/passwd') SELECT content)
====
FROM read_csv('/etc/passwd')
====
FROM '/etc/passwd'
====
FROM duckdb_settings()
====
SELECT * FROM events WHERE metric_name = 'x' OR (SELECT count(*) FROM sniff_csv('/etc/passwd')) > 0
====
SELECT sleep_ms(100000)
====
SELECT * FROM repeat(1, 1000000000)
====
SELECT write_log('x')
====
SELECT * FROM sql_auto_complete('SEL')
====
SELECT * FROM events USING SAMPLE 10 PERCENT (bernoulli) WHERE (SELECT 1 FROM duckdb_settings()) = 1
====
SELECT * FROM events_backup
====
SELECT * FROM "events"."x"
====
SELECT "/etc/passwd".* FROM events AS "/etc/passwd"
====
SELECT * FROM read_csv
('/etc/passwd')
====
-- comment first
DROP TABLE events
====
SELECT 1 --
; DROP TABLE events
====
	DELETE	FROM	events	
====
 
  DROP TABLE events
====
SELECT count(*) FROM events; -- trailing
DELETE FROM events
====
SELECT 1
;
DROP TABLE events
====
SELECT *
FROM events
WHERE node_id IN (
  SELECT content
  FROM read_text('/etc/passwd')
)
====
SELECT 1 /* ; */; CHECKPOINT
====
SELECT 1; DROP TABLE events
====
WITH schema_version AS (SELECT * FROM schema_version) SELECT * FROM schema_version
====
WITH a AS (FROM schema_version), schema_version AS (SELECT 1) FROM a
====
WITH RECURSIVE a AS (FROM schema_version), schema_version AS (SELECT 1) FROM a
====
WITH x AS (SELECT 1 AS v), schema_version AS (SELECT * FROM schema_version) SELECT * FROM x, schema_version
====
SELECT * FROM (WITH secrets AS (SELECT * FROM secrets) SELECT * FROM secrets) s
====
WITH RECURSIVE t(n) AS (SELECT * FROM t UNION ALL SELECT 1) SELECT * FROM t
====
SELECT get_block_size('store')
====
SELECT format_type(23, -1)
====
SELECT pg_get_viewdef(1)
====
SELECT index_key('events', 'x')
====
SELECT main.upper(node_id) FROM events
====
SELECT system.main.lower(node_id) FROM events
====
SELECT len(range(1000000000))
====
SELECT max(length(repeat(event_id, 20000000))) FROM events
====
SELECT list_reduce(range(100000000), (a, b) -> a + b)
====
SELECT list_sort(range(100000000))
====
SELECT len(string_split(repeat('a,', 5e7), ','))
====
SELECT count(*) FROM range(1000000000) a, range(1000000000) b
====
SELECT repeat('x', 1000000000)
====
SELECT lpad('x', 1000000000, 'y')
====
SELECT count(*) FROM generate_series(1, 10 * 1000 * 1000 * 1000)
====
SELECT list_resize([1], 1e12)
====
WITH x AS (SELECT 1) COPY events TO 'leak.csv'
====
SELECT * FROM (SELECT 1) t JOIN ('x.csv') f ON true
====
SELECT * FROM events e, 'passwd' p
====
SELECT * FROM "secrets.parquet"
====
SELECT count(*) FROM events WHERE EXISTS (SELECT * FROM '/etc/passwd')
====
SELECT count(*) FROM events WHERE rank > 0 AND (SELECT count(*) FROM 'leak.csv') > 0
====
SELECT NOT EXISTS (FROM '/etc/passwd')
====
SELECT ARRAY(FROM '/etc/hostname')
====
SELECT CASE WHEN rank > 0 THEN (SELECT 1 FROM 'secrets.parquet') END FROM events
====
SELECT * FROM (SHOW TABLES)
====
SELECT * FROM events, (DESCRIBE events)
====
FROM (SUMMARIZE events)
====
WITH schema_version AS (SELECT 1) SELECT * FROM main.schema_version
====
WITH schema_version AS (SELECT 1) SELECT * FROM "main"."schema_version"
====
WITH schema_version AS (SELECT 1) TABLE main.schema_version
====
SELECT current_user
====
SELECT user
====
SELECT "user"()
====
SELECT session_user
====
SELECT current_schema
====
SELECT current_catalog
====
SELECT current_role
====
SELECT setseed(0.5)
====
SELECT node_id, current_user AS u FROM events
====
SELECT * FROM events WHERE node_id = current_schema
