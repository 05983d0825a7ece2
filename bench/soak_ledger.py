"""The soak's look at what the finance API cannot show: admits, and rows under no organization.

    python bench/soak_ledger.py LEDGER_DIR REQUEST_ID_PREFIX

Opens a stopped control plane's embedded chDB ledger (one process at a time may hold it) and
prints, as JSON, for the request ids starting with the prefix: how many admit records each has
(`admits`), and the outcome rows recorded under no organization, `[kind, status, refused]` per
request id (`keyless`: requests refused before their key was known). A process of its own, so
chDB's native library never loads into the load generator.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from controlplane.ledger.client import connect
from controlplane.settings import LedgerLocation


def main(ledger_dir: str, prefix: str) -> None:
    client = connect(LedgerLocation(kind="chdb", path=Path(ledger_dir)))
    try:
        parameters = {"prefix": prefix}
        admits = client.query(
            "SELECT request_id, count() FROM ledger_admits FINAL "
            "WHERE startsWith(request_id, {prefix:String}) GROUP BY request_id",
            parameters=parameters,
        ).result_rows
        keyless = client.query(
            "SELECT request_id, kind, status, refused FROM ledger_rows FINAL "
            "WHERE organization_id = '' AND startsWith(request_id, {prefix:String})",
            parameters=parameters,
        ).result_rows
    finally:
        client.close()
    found: dict[str, list[list[object]]] = {}
    for request_id, kind, status, refused in keyless:
        found.setdefault(str(request_id), []).append([str(kind), int(status), bool(refused)])
    json.dump({"admits": {str(r): int(n) for r, n in admits}, "keyless": found}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
