"""Prints the JobSpec the Python client (clients/python) submits for one call, as hex.

    python_job_spec.py '{"method": "reshard", "args": ["ckpt", "out", 2], "kwargs": {...}}'

The call goes through the client's public consolidate()/reshard() methods; only the final
SubmitJob is replaced, so no daemon is needed. Relative paths resolve against the current
folder, as they do for a user of the client.
"""

import json
import sys

import reshard_client


def main() -> None:
    call = json.loads(sys.argv[1])
    client = reshard_client.Client("127.0.0.1:1")  # never connected: _submit is replaced
    sent = []
    client._submit = lambda spec, key: sent.append(spec) or "job"
    getattr(client, call["method"])(*call["args"], **call["kwargs"])
    if len(sent) != 1:
        raise SystemExit("expected one submitted spec, got %d" % len(sent))
    sys.stdout.write(sent[0].SerializeToString().hex())


if __name__ == "__main__":
    main()
