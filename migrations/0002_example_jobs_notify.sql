-- LISTEN/NOTIFY wake-ups for example_jobs (dbworker migration --table example_jobs --notify).
-- Workers with StoreOptions::listen = Listen::TableChannel start new jobs at once.
-- Wakes dbworker listeners on channel 'dbworker_example_jobs' when jobs are queued.
-- Each notification carries a job id: a listening store whose claim cursor
-- has passed it takes the cursor back at once.
CREATE OR REPLACE FUNCTION "example_jobs_dbworker_notify_insert"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The lowest id the statement inserted; nothing when it inserted none.
    PERFORM pg_notify(TG_ARGV[0], min("id")::text) FROM dbworker_inserted
        HAVING min("id") IS NOT NULL;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION "example_jobs_dbworker_notify_row"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], NEW."id"::text);
    RETURN NULL;
END
$$;
-- One notification per INSERT statement, however many rows it inserts.
CREATE OR REPLACE TRIGGER "example_jobs_dbworker_notify_insert" AFTER INSERT ON "example_jobs"
    REFERENCING NEW TABLE AS dbworker_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION "example_jobs_dbworker_notify_insert"('dbworker_example_jobs');
-- One per row that goes back to queued (a requeue, a reset, a release).
CREATE OR REPLACE TRIGGER "example_jobs_dbworker_notify_requeue" AFTER UPDATE OF "state" ON "example_jobs"
    FOR EACH ROW WHEN (NEW."state" = 'queued' AND OLD."state" IS DISTINCT FROM 'queued')
    EXECUTE FUNCTION "example_jobs_dbworker_notify_row"('dbworker_example_jobs');
