"""The tables of the embedded store's SQLite file, created when it is opened if missing.

Apart from the store's reads and writes so the whole layout of the file (the log, the
positions, states, views and the runner's bookkeeping) reads in one place. Every statement
can run again on an existing file (``IF NOT EXISTS``, ``INSERT OR IGNORE``): opening a file
an earlier version made brings it up to this layout.
"""

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        topic TEXT NOT NULL,
        partition_key TEXT NOT NULL,
        event_type TEXT,
        invocation_id TEXT,
        payload BLOB NOT NULL,
        traceparent TEXT)""",
    "CREATE INDEX IF NOT EXISTS log_topic_seq ON log(topic, seq)",
    "CREATE INDEX IF NOT EXISTS log_invocation ON log(invocation_id)",
    "CREATE TABLE IF NOT EXISTS positions (process TEXT PRIMARY KEY, seq INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS state (
        process TEXT NOT NULL,
        key TEXT NOT NULL,
        blob BLOB NOT NULL,
        next_due INTEGER,
        PRIMARY KEY (process, key))""",
    "CREATE INDEX IF NOT EXISTS state_due ON state(process, next_due)",
    """CREATE TABLE IF NOT EXISTS views (
        view TEXT NOT NULL,
        key TEXT NOT NULL,
        value_json TEXT NOT NULL,
        PRIMARY KEY (view, key))""",
    # Runner bookkeeping, e.g. whether the last lock holder stopped cleanly.
    "CREATE TABLE IF NOT EXISTS runner_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # When each ``requests`` row was appended (SQLite's clock, epoch ms): requests carry
    # bearer session tokens, so consumed ones are pruned after ``requests_retention_ms``
    # (``StoreTx.prune_requests``, ADR 0016). Rows from before this table count as epoch 0.
    "CREATE TABLE IF NOT EXISTS request_times (seq INTEGER PRIMARY KEY, appended_at INTEGER)",
    """CREATE TRIGGER IF NOT EXISTS request_times_on_insert AFTER INSERT ON log
        WHEN NEW.topic = 'requests' BEGIN
        INSERT INTO request_times(seq, appended_at)
        VALUES (NEW.seq, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)); END""",
    """INSERT OR IGNORE INTO request_times(seq, appended_at)
        SELECT seq, 0 FROM log WHERE topic = 'requests'
        AND NOT EXISTS (SELECT 1 FROM request_times)""",
    # One dead-letter per poison log row, however many processes consume its topic.
    """CREATE TABLE IF NOT EXISTS dead_lettered (
        topic TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (topic, seq))""",
)
