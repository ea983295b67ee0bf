"""The test S3 server's keys (the sync tests' identity)."""

ACCESS_KEY, SECRET_KEY = "flywheel", "flywheel-secret"
