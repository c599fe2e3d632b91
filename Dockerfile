# context-proxy: slim image, non-root, the packaged config (mount your own at /config and pass --config).
#   docker build -t context-proxy .
#   docker run -p 8787:8787 -v proxy-state:/data context-proxy          # the packaged default config
#   your own: -v "$PWD/myconfig:/config:ro" ... context-proxy context-proxy serve --config /config/proxy.toml --host 0.0.0.0
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install . && useradd --system --uid 10001 --home /app proxy && mkdir /data && chown -R proxy /app /data
# state.path = "/data/journals.sqlite" keeps session journals across restarts.
VOLUME /data

USER proxy
EXPOSE 8787
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2).status != 200)"
# Binding 0.0.0.0 puts /sessions and /metrics behind server.admin_token_env (see README).
CMD ["context-proxy", "serve", "--host", "0.0.0.0", "--port", "8787"]
