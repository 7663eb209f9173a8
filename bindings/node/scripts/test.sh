#!/usr/bin/env bash
# The Node binding's tests: installs Node >= 22 and the pinned npm packages (setup.sh),
# builds the addon in release with napi-rs and the TypeScript with tsc, then runs the
# node:test suites under test/ and prints the test runner's summary.
# Usage: bash bindings/node/scripts/test.sh [test files...]
set -euo pipefail

PACKAGE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NODE_BIN="$(bash "$PACKAGE_DIR/scripts/setup.sh" | tail -1)"
export PATH="$NODE_BIN:$PATH"
cd "$PACKAGE_DIR"

echo "== node $(node --version); building the addon (release) and the TypeScript" >&2
npx napi build --platform --release --strip --esm --output-dir native --js index.js --dts index.d.ts >&2
npx tsc -p tsconfig.json

if [ "$#" -gt 0 ]; then
  files=("$@")
else
  files=(test/*.test.mjs)
fi
node --test --test-concurrency=1 --test-reporter=spec "${files[@]}"
