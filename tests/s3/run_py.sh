#!/bin/sh
# Runs a Python test with Debian's interpreter (never a pyenv shim first on PATH).
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 "$@"
