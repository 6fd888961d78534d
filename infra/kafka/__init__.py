"""Kafka adapters: the embedded Tansu broker, topic creation, client start-up with retries."""
