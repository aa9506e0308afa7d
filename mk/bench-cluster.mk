# The cluster-in-a-box benchmark (issue 21): every algorithm with one process per network-namespace
# node, links rate-limited with tbf at each preset. Not part of `make test`; needs root.

.PHONY: bench-cluster

## bench-cluster: algorithms on NODES namespaces at LINKS presets (bench/cluster.sh); out/bench/cluster/.
bench-cluster: data
	@bench/cluster.sh
