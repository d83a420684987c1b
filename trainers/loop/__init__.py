"""The training loop's feed and records: which examples each step, rank and micro batch take, and
where each step's record goes."""
