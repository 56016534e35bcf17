"""Vertical autoscaling of GPU shares: recommendations from measured usage, cron rules and external scalers."""
