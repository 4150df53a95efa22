"""What holds database resources: engines and their pools, the store's own driver connections, read replicas, the live tail's notifier and waiters, and running an Op on an engine."""
