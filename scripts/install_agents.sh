#!/usr/bin/env bash
# The agent CLIs that tests/agents/ and bench/agents.py drive, at pinned versions, installed with npm
# into .cache/agents (gitignored; AGENTS_PREFIX overrides). Nothing is fetched when both are in place.
# Prints the bin folder; exits non-zero when the install fails, so .ci/run fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=("@anthropic-ai/claude-code@2.1.332" "@openai/codex@0.171.0")
PREFIX="${AGENTS_PREFIX:-$PWD/.cache/agents}"
command -v npm >/dev/null || { echo "install_agents: npm is not on PATH" >&2; exit 1; }
installed() {
  local spec manifest
  for spec in "${PACKAGES[@]}"; do
    manifest="$PREFIX/node_modules/${spec%@*}/package.json"
    [ -f "$manifest" ] && [ "$(node -p "require('$manifest').version")" = "${spec##*@}" ] || return 1
  done
  [ -x "$PREFIX/node_modules/.bin/claude" ] && [ -x "$PREFIX/node_modules/.bin/codex" ]
}
if ! installed; then
  mkdir -p "$PREFIX"
  # One command for both: a package.json pins them, so neither install removes the other.
  npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --loglevel=error "${PACKAGES[@]}" >&2
  installed || { echo "install_agents: ${PACKAGES[*]} did not install into $PREFIX" >&2; exit 1; }
fi
echo "$PREFIX/node_modules/.bin"
