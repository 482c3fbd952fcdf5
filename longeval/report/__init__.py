"""Human-readable views of aggregated results."""
