SET LOCAL statement_timeout = '2000ms'
