"""Compare cache tiers with the database, entry by entry, and tell stale from still in flight.

``judge`` holds the rules (pure: what is stale, in flight, missing, unverifiable, and the nines);
``run`` reads the database and the tiers and applies them (``freshkey verify``, the tests, the demo).
"""
