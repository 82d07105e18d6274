"""Scheduling: per-group statistics now; admission, CPU and memory arrive here."""
