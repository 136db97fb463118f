SET LOCAL lock_timeout = '1500ms'
