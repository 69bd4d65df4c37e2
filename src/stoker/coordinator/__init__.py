"""The coordinator: dynamic leases, work stealing and exactly-once delivery across machines."""
