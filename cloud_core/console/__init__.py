"""The operator console: the core-side request handler and the `cfnetctl` client, over MQTT 5."""
