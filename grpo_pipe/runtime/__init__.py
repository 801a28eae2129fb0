"""What a job's process shares with every layer: the environment variables it reads or sets, stop requests (signals)
the test-only halt points, and the undertaker that stops what a killed job started (Ray's node processes)."""
