SET LOCAL enable_seqscan = off
