"""Test harness: starts the real far sides (Prometheus, Alertmanager, Slurm, pitcrew itself) on loopback."""
