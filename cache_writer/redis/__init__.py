"""The Redis tier: its scripts, the redirect-following pipeline, and the tier itself."""
