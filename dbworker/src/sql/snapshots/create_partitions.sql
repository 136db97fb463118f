SELECT "app"."example_jobs_create_partitions"($1::integer) AS "partition"
