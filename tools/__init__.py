"""Developer tools: the network-namespace lab, simulators, benchmarks, certificates."""
