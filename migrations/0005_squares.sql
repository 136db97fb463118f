-- The quickstart's handler writes each job's square here, in the job's transaction.
CREATE TABLE squares (n bigint PRIMARY KEY, square bigint NOT NULL);
