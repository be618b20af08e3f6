"""The clustered bus (NATS JetStream): build script and a loopback cluster harness."""
