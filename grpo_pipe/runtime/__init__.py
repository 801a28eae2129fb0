"""What a job's process shares with every layer: the environment variables it reads or sets, stop requests (signals)
and the test-only halt points."""
