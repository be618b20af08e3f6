"""``python -m tools.helm render|check|path``: see tools/helm/__init__.py."""

from __future__ import annotations

import sys

from tools.helm import check, ensure_helm, render


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "check"
    if cmd == "render":
        for p in render():
            print(p)
        return 0
    if cmd == "check":
        stale = check()
        if stale:
            print("deploy/k8s differs from the chart in: " + ", ".join(stale)
                  + "\n  run: python -m tools.helm render", file=sys.stderr)
            return 1
        print("deploy/k8s matches deploy/helm/cfnet")
        return 0
    if cmd == "path":
        print(ensure_helm())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
