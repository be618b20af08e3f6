"""Test control plane: build kube-apiserver + etcd from the Go module proxy and run them."""

from tools.envtest.harness import (
    ControlPlane,
    Credentials,
    EnvtestError,
    all_binary_paths,
    ensure_binaries,
)

__all__ = ["ControlPlane", "Credentials", "EnvtestError", "all_binary_paths", "ensure_binaries"]
