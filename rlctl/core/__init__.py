"""The floor below runs/, executors/ and backends/: the types they share (a run's state and handle, a
checkpoint, the secrets rule, a host), so that those three never import each other for a type."""
