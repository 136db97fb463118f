-- LISTEN/NOTIFY wake-ups for example_jobs (dbworker migration --table example_jobs --notify).
-- Workers with StoreOptions::listen = Listen::TableChannel start new jobs at once.
-- Wakes dbworker listeners on channel 'dbworker_example_jobs' when jobs are queued.
CREATE OR REPLACE FUNCTION "example_jobs_dbworker_notify"() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER "example_jobs_dbworker_notify_insert" AFTER INSERT ON "example_jobs"
    FOR EACH STATEMENT EXECUTE FUNCTION "example_jobs_dbworker_notify"('dbworker_example_jobs');
CREATE OR REPLACE TRIGGER "example_jobs_dbworker_notify_requeue" AFTER UPDATE OF "state" ON "example_jobs"
    FOR EACH ROW WHEN (NEW."state" = 'queued' AND OLD."state" IS DISTINCT FROM 'queued')
    EXECUTE FUNCTION "example_jobs_dbworker_notify"('dbworker_example_jobs');
