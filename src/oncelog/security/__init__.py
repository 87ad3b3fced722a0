"""Who a connection is and what it may do: the principal, authentication (TLS, SASL),
authorization (ACLs) and quotas. Knows nothing of the log or of any coordinator's state."""
