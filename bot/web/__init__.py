"""HTTP surface: the Alertmanager webhook, the incidents and command API, health and metrics."""
