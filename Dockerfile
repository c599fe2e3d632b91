# context-proxy: slim image, non-root (uid 10001), the packaged config (mount your own at /config and pass --config).
#   docker build -t context-proxy .
#   docker run -p 8787:8787 -v proxy-state:/data context-proxy          # the packaged default config
#   your own: -v "$PWD/myconfig:/config:ro" ... context-proxy context-proxy serve --config /config/proxy.toml --host 0.0.0.0
# Needs BuildKit (the default builder since Docker 23; on older clients DOCKER_BUILDKIT=1).
# Behind a TLS-intercepting proxy or a private index, pass them to the build, not into the image:
#   --secret id=pip_cert,src=/path/to/ca-bundle.crt   --build-arg PIP_INDEX_URL=https://mirror/simple
# scripts/docker_check.sh builds and checks the image end to end (and can build a stand-in BASE).
ARG BASE=python:3.11-slim
FROM ${BASE}

# Empty = pip's own default (PyPI). Build args show in `docker history`: no credentials in them.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# The debian-based image ships a system user "proxy" (uid 13): ours is context-proxy, 10001:10001.
# The sources are bind-mounted (rw: the build's scratch files are discarded), so only the installed package lands.
RUN --mount=type=bind,target=/src,rw --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi \
    && pip install /src \
    && groupadd --gid 10001 context-proxy \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /data --shell /usr/sbin/nologin context-proxy \
    && mkdir /data && chown 10001:10001 /data
# state.path = "/data/journals.sqlite" keeps session journals across restarts.
VOLUME /data
WORKDIR /data

USER 10001:10001
EXPOSE 8787
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8787/healthz', timeout=2).status != 200)"
# Binding 0.0.0.0 puts /sessions and /metrics behind server.admin_token_env (see README).
CMD ["context-proxy", "serve", "--host", "0.0.0.0", "--port", "8787"]
