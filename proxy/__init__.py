"""context-proxy: a streaming reverse proxy that fits agent conversations to the model's window."""

__version__ = "0.1.0"
