"""`context-proxy wrap AGENT [ARGS...]`: an agent CLI run through the proxy (started if none is running)."""
