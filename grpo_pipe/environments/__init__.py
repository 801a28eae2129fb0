"""Episodes: one turn (`environment=single_turn`), tool-using turns (`tools`) or the user's own environment class
(`python`). Each is a small component behind `interfaces.Environment`, built from `conf/environment/`."""
