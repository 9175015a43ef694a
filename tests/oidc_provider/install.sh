#!/usr/bin/env bash
# Installs the certified OpenID Provider the sign-in tests run (oidc-provider, pinned by package-lock.json) into
# tests/oidc_provider/node_modules. Idempotent: nothing is fetched when what is installed matches the lock file.
set -euo pipefail
cd "$(dirname "$0")"
stamp=node_modules/.installed-from-lock
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
