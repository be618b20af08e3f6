"""``python -m cloud_core.k8s``: the same process as ``cfnet-core --kubernetes`` (the chart's
entry point, ``cloud_core.main``), with its lifecycle lines on (``--json-lines``). One
Kubernetes entry point: its links, pool controller, console and broker are this one's too."""

from __future__ import annotations

import sys

from cloud_core.main import main

if __name__ == "__main__":
    raise SystemExit(main(["--kubernetes", "--json-lines", *sys.argv[1:]]))
